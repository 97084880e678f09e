import DatamodeHTTP
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What the origin answers to a request.
public indirect enum OriginResponse: Sendable {
    /// A well-formed response; `reason` defaults to the standard phrase.
    case respond(status: Int, reason: String? = nil, headers: [HTTPField] = [], body: [UInt8] = [],
                 framing: OriginBodyFraming = .contentLength)
    /// These bytes exactly (a malformed response, a response split oddly), then close if asked.
    case raw([UInt8], thenClose: Bool)
    /// These bytes in pieces, each but the last followed by `pause` (a response that reaches the proxy in parts),
    /// then close if asked.
    case pieces([[UInt8]], pause: Duration, thenClose: Bool)
    /// Close the connection without a byte of response.
    case closeWithoutResponse
    /// Wait, then answer (upstream timeouts). The wait ends early when the origin is stopped.
    case delay(Duration, then: OriginResponse)
    /// An interim 1xx response (e.g. 103 Early Hints, an unsolicited 100), then the final one.
    case interim(status: Int, headers: [HTTPField] = [], then: OriginResponse)
    /// A large body streamed from a generator.
    case stream(status: Int, headers: [HTTPField] = [], body: BodyGenerator, framing: OriginBodyFraming = .contentLength)

    /// `200 OK` with a text body and `Content-Length`.
    public static func ok(_ body: String = "ok", headers: [(String, String)] = []) -> OriginResponse {
        .respond(status: 200, headers: headers.map { HTTPField(name: $0.0, value: $0.1) }, body: Array(body.utf8))
    }

    /// A response with the given status, fields and text body, framed with `Content-Length`
    /// (or bodiless for 1xx, 204 and 304).
    public static func status(_ status: Int, _ body: String = "", headers: [(String, String)] = []) -> OriginResponse {
        let fields = headers.map { HTTPField(name: $0.0, value: $0.1) }
        if status < 200 || status == 204 || status == 304 {
            return .respond(status: status, headers: fields, body: [], framing: .bodiless)
        }
        return .respond(status: status, headers: fields, body: Array(body.utf8))
    }

    /// These bytes, exactly; the connection stays open unless `thenClose`.
    public static func raw(_ text: String, thenClose: Bool = false) -> OriginResponse {
        .raw(Array(text.utf8), thenClose: thenClose)
    }
}
