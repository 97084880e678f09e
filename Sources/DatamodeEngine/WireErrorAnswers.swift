import DatamodeHTTP
import DatamodePolicy

/// How a client's broken HTTP/1 is answered (SPEC §6): the error code and the problem's detail. A broken origin
/// is always `upstream-protocol-error`, with the same detail.
extension HTTPWireError {
    /// The error code of a request that breaks HTTP/1: `400`, `414` or `431`.
    var clientErrorCode: ProxyErrorCode {
        switch self {
        case .malformed: .badRequest
        case .requestLineTooLong: .uriTooLong
        case .headerSectionTooLarge: .headersTooLarge
        }
    }

    /// What the problem's `detail` says.
    var detail: String {
        switch self {
        case .malformed(let why): why
        case .requestLineTooLong: "the request line is longer than limits.request-line"
        case .headerSectionTooLarge: "the header section exceeds limits.header-section or limits.header-count"
        }
    }
}
