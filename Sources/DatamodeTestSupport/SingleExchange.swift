import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One request on a fresh connection, its response read strictly, the connection closed.
public enum SingleExchange {
    /// Sends `text` (exact bytes) to 127.0.0.1:`port` and reads the final response (1xx skipped unless 101).
    public static func send(_ text: String, to port: UInt16, method: String = "GET",
                            timeout: Duration = .seconds(10)) throws -> ParsedResponse {
        let client = try RawHTTPClient(port: port, timeout: timeout)
        defer { client.close() }
        try client.send(text)
        return try client.readFinalResponse(method: method)
    }

}
