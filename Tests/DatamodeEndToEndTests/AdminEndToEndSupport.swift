// Helpers shared by the admin end-to-end tests (AdminEndToEndTests.swift, AdminStateEndToEndTests.swift,
// AdminCLIEndToEndTests.swift, AdminMeasurementEndToEndTests.swift, VariantFilesEndToEndTests.swift,
// UltraConstrainedEndToEndTests.swift): one definition each, in one file of their own.
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Ends a proxy whose shutdown is not what the test is about: SIGKILL, then wait for it.
///
/// Not `stop()`: a proxy started by the test process (Foundation.Process) inherits a signal mask that blocks
/// SIGTERM, and the proxy does not unblock it, so `stop()` waits 15 s for nothing and then kills it anyway
/// (reported as a product bug; `persistenceAcrossRestart` keeps checking the graceful path).
func halt(_ proxy: ProxyProcess) {
    guard proxy.process.isRunning else { return }
    proxy.signal(SIGKILL)
    proxy.waitForExit(timeout: 10)
}

/// Starts the proxy, hands it and an admin client (with `token`) to `body`, and ends it whatever happens.
func withAdminProxy(config: String = "", arguments: [String] = [], environment: [String: String] = [:],
                    token: String? = nil, directory: String? = nil,
                    _ body: (ProxyProcess, AdminAPIClient) throws -> Void) throws {
    let proxy = try ProxyProcess(config: config, arguments: arguments, environment: environment, directory: directory)
    defer {
        halt(proxy)
        if directory == nil { try? FileManager.default.removeItem(atPath: proxy.directory) }
    }
    try body(proxy, AdminAPIClient(port: proxy.adminPort, token: token))
}

/// One proxied request on an open client connection: absolute-form `method url`, the response read whole.
func proxied(_ client: RawHTTPClient, _ url: String, method: String = "GET", headers: [(String, String)] = [],
             body: String? = nil) throws -> ParsedResponse {
    try client.send(RequestText.make(method, url, headers: headers, body: body))
    return try client.readFinalResponse(method: method)
}

/// A JSON text of `object` (sorted keys), for request bodies.
func jsonText(_ object: Any) -> String {
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
    return String(decoding: data, as: UTF8.self)
}

/// The variant with `id` in a `GET /variants` answer.
func variant(_ id: String, in reply: AdminReply) -> [String: Any]? {
    reply.array?.first { $0["id"] as? String == id }
}

/// `since` of a mode document as a date, when it is RFC 3339.
func rfc3339(_ text: Any?) -> Date? {
    guard let text = text as? String else { return nil }
    let plain = ISO8601DateFormatter()
    if let date = plain.date(from: text) { return date }
    let fractional = ISO8601DateFormatter()
    fractional.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return fractional.date(from: text)
}

/// Checks a problem document answer: status, media type, `error` present and `status` member agreeing.
func expectProblem(_ reply: AdminReply, _ status: Int, error: String? = nil, _ what: String,
                   sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(reply.status == status, "\(what): \(reply.status) \(reply.bodyText)", sourceLocation: sourceLocation)
    #expect(reply.mediaType == "application/problem+json", "\(what): Content-Type \(reply.value(of: "Content-Type") ?? "none")",
            sourceLocation: sourceLocation)
    #expect(reply.object["status"] as? Int == status, "\(what): problem status member in \(reply.bodyText)",
            sourceLocation: sourceLocation)
    if let error {
        #expect(reply.errorCode == error, "\(what): error code in \(reply.bodyText)", sourceLocation: sourceLocation)
    } else {
        #expect(!(reply.errorCode ?? "").isEmpty, "\(what): no error code in \(reply.bodyText)", sourceLocation: sourceLocation)
    }
}

/// The mode document's four facts, for compact comparisons.
struct ModeFacts: Equatable, CustomStringConvertible {
    var mode: String
    var constrained: Bool
    var expensive: Bool
    var source: String

    init(_ mode: String, _ constrained: Bool, _ expensive: Bool, _ source: String) {
        self.mode = mode
        self.constrained = constrained
        self.expensive = expensive
        self.source = source
    }

    init?(_ reply: AdminReply) {
        let o = reply.object
        guard let mode = o["mode"] as? String, let c = o["constrained"] as? Bool, let e = o["expensive"] as? Bool,
              let source = o["source"] as? String else { return nil }
        self.init(mode, c, e, source)
    }

    var description: String { "\(mode) (constrained \(constrained), expensive \(expensive), source \(source))" }
}

func modeFacts(_ admin: AdminAPIClient) throws -> ModeFacts? {
    ModeFacts(try admin.get("/mode"))
}
