import DatamodeHTTP
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One request as the origin received it: the exact bytes the proxy forwarded, and where they arrived.
public struct RecordedRequest: Sendable {
    /// 0-based position among every request this origin received.
    public let sequence: Int
    /// 1-based number of the TCP connection it arrived on (in accept order).
    public let connection: Int
    /// 0-based position among the requests of that connection.
    public let indexOnConnection: Int
    /// The parsed head (strictly, with `DatamodeHTTP`).
    public let head: RequestHead
    /// The head exactly as received, from the request line through the empty line.
    public let headBytes: [UInt8]
    /// The body exactly as received (chunk framing and trailers included); empty when `bodyTruncated`.
    public let body: [UInt8]
    /// The body with any chunked coding removed; empty when `bodyTruncated`.
    public let payload: [UInt8]
    /// True when the body was longer than the origin's recording limit: only lengths and the checksum are kept.
    public let bodyTruncated: Bool
    /// Body bytes on the wire (framing included).
    public let bodyLength: UInt64
    /// Decoded body bytes.
    public let payloadLength: UInt64
    /// `StreamChecksum` of the decoded body.
    public let payloadChecksum: UInt64

    /// Head and body exactly as received.
    public var raw: [UInt8] { headBytes + body }
    public var headText: String { String(decoding: headBytes, as: UTF8.self) }
    public var bodyText: String { String(decoding: payload, as: UTF8.self) }
    public var method: String { head.method }
    public var target: String { head.target }
    /// Every value of the field `name` (any case), in order.
    public func values(of name: String) -> [String] { head.values(of: name) }
    /// The value of the field `name` if it appears exactly once, else `nil`.
    public func value(of name: String) -> String? {
        let all = head.values(of: name)
        return all.count == 1 ? all[0] : nil
    }
    /// Whether the field `name` appears at all.
    public func contains(_ name: String) -> Bool { head.contains(name) }
}
