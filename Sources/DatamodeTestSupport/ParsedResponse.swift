import DatamodeHTTP
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A response as the client received it.
public struct ParsedResponse: Sendable {
    public let head: ResponseHead
    /// The head exactly as received.
    public let headBytes: [UInt8]
    /// The body, chunked coding removed; empty when it was handed to a body sink instead.
    public let body: [UInt8]
    /// How the body was delimited on the wire.
    public let framing: BodyFraming
    /// Decoded body bytes (also counted when a sink took them).
    public let bodyLength: UInt64
    /// Trailer fields of a chunked body.
    public let trailers: [HTTPField]

    public var status: Int { head.status }
    public var reason: String { head.reason }
    public var headers: [HTTPField] { head.fields }
    public var headText: String { String(decoding: headBytes, as: UTF8.self) }
    public var bodyText: String { String(decoding: body, as: UTF8.self) }
    /// Every value of `name` (any case), in order.
    public func values(of name: String) -> [String] { head.values(of: name) }
    /// The value of `name` when it appears exactly once, else `nil`.
    public func value(of name: String) -> String? {
        let all = head.values(of: name)
        return all.count == 1 ? all[0] : nil
    }
    public func contains(_ name: String) -> Bool { head.contains(name) }

    /// The body decoded as a problem document (RFC 9457), when it is one.
    public var problem: ProblemDocument? { try? JSONDecoder().decode(ProblemDocument.self, from: Data(body)) }
}
