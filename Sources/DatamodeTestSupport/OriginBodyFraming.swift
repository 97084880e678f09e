import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// How the origin frames a response body it sends.
public enum OriginBodyFraming: Sendable, Hashable {
    /// `Content-Length` (added unless the headers already carry one).
    case contentLength
    /// `Transfer-Encoding: chunked`, in chunks of at most this many bytes.
    case chunked(chunkSize: Int)
    /// No length at all: the body ends when the origin closes the connection.
    case closeDelimited
    /// The head only, exactly as given (no framing field is added, no body is sent): HEAD, 204, 304, 1xx.
    case bodiless
}
