import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One answer of the admin API, with its body decoded as JSON where it is JSON.
public struct AdminReply: Sendable {
    public let response: ParsedResponse

    public var status: Int { response.status }
    public var bodyText: String { response.bodyText }
    public func value(of name: String) -> String? { response.value(of: name) }
    public func values(of name: String) -> [String] { response.values(of: name) }
    /// The media type of `Content-Type` (parameters dropped, lowercased).
    public var mediaType: String? {
        response.value(of: "Content-Type").map {
            String($0.split(separator: ";").first ?? "").trimmingCharacters(in: .whitespaces).lowercased()
        }
    }

    /// The body parsed as JSON, or nil when it is not JSON.
    public var json: Any? { try? JSONSerialization.jsonObject(with: Data(response.body), options: [.fragmentsAllowed]) }
    /// The body as a JSON object (empty when it is not one).
    public var object: [String: Any] { json as? [String: Any] ?? [:] }
    /// The body as a JSON array of objects (nil when it is not one).
    public var array: [[String: Any]]? { json as? [[String: Any]] }
    /// The `error` member of a problem document.
    public var errorCode: String? { object["error"] as? String }
}
