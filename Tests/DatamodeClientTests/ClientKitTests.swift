// The client kit (SPEC §14) on Linux, through the real proxy binary: the WWDC 2019 adaptiveLoader pattern in
// normal and constrained modes, the rejection as a URLError with the network-unavailable reason, and the path
// monitor following /events.
import DatamodeClient
import DatamodeTestSupport
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization
import Testing

/// The app code under test, as in WWDC 2019 "Advances in Networking, Part 1" (`adaptiveLoader`): try the
/// full-size image without allowing constrained access; on `.constrained`, load the low-resolution one.
func adaptiveLoad(_ session: URLSession, full: URL, low: URL) throws -> (data: Data, usedLowRes: Bool) {
    var request = URLRequest(url: full)
    #if canImport(Darwin)
    request.allowsConstrainedNetworkAccess = false
    #else
    request.dataModeAllowsConstrainedNetworkAccess = false
    #endif
    switch fetch(session, request) {
    case .success(let data):
        return (data, false)
    case .failure(let error as URLError) where error.dataModeUnavailableReason == .constrained:
        guard case .success(let data) = fetch(session, URLRequest(url: low)) else { throw error }
        return (data, true)
    case .failure(let error):
        throw error
    }
}

/// One data task, waited for (deadline 20 s).
func fetch(_ session: URLSession, _ request: URLRequest) -> Result<Data, any Error> {
    let done = DispatchSemaphore(value: 0)
    let result = Mutex<Result<Data, any Error>>(.failure(URLError(.timedOut)))
    session.dataTask(with: request) { data, response, error in
        result.withLock { value in
            if let error {
                value = .failure(error)
            } else if let http = response as? HTTPURLResponse, http.statusCode == 200 {
                value = .success(data ?? Data())
            } else {
                value = .failure(URLError(.badServerResponse))
            }
        }
        done.signal()
    }.resume()
    _ = done.wait(timeout: .now() + 20)
    return result.withLock { $0 }
}

@Suite("Client kit: URLProtocol and path monitor against the real proxy", .serialized)
struct ClientKitTests {
    static let full = String(repeating: "F", count: 4096)
    static let low = String(repeating: "l", count: 256)

    /// The hero image in full and small (`@small.jpg`).
    static let images: RecordingOrigin.Handler = { request in
        request.head.target.hasSuffix("@small.jpg") ? .ok(Self.low, headers: [("Content-Type", "image/jpeg")])
            : .ok(Self.full, headers: [("Content-Type", "image/jpeg")])
    }

    static func withProxy(config: String = "", origin answer: @escaping RecordingOrigin.Handler = Self.images,
                          _ body: (ProxyProcess, AdminAPIClient, RecordingOrigin, URLSession) throws -> Void) throws {
        let origin = try RecordingOrigin(handler: answer)
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: config)
        defer {
            proxy.signal(SIGKILL)
            proxy.waitForExit(timeout: 10)
            try? FileManager.default.removeItem(atPath: proxy.directory)
        }
        let configuration = URLSessionConfiguration.ephemeral
        DataModeURLProtocol.install(on: configuration, proxyHost: "127.0.0.1", proxyPort: Int(proxy.port))
        let session = URLSession(configuration: configuration)
        defer { session.invalidateAndCancel() }
        try body(proxy, AdminAPIClient(port: proxy.adminPort), origin, session)
    }

    @Test("adaptiveLoader, normal mode: the full-size image, through the proxy, tagged Allow-Constrained: ?0")
    func adaptiveNormal() throws {
        try Self.withProxy { _, _, origin, session throws in
            let (data, usedLowRes) = try adaptiveLoad(session, full: URL(string: origin.url("/img/hero.jpg"))!,
                                                      low: URL(string: origin.url("/img/hero@small.jpg"))!)
            #expect(!usedLowRes)
            #expect(data == Data(Self.full.utf8))
            let seen = origin.requests
            #expect(seen.count == 1)
            #expect(seen.first?.head.values(of: "allow-constrained") == ["?0"])
            #expect(seen.first?.head.values(of: "via").first?.contains("datamode-proxy") == true, "it went through the proxy")
        }
    }

    /// Found when the proxy's writes of a response split differently (session 26): swift-corelibs-foundation's
    /// `urlProtocol(_:didLoad:)` replaces the task's data instead of appending to it, so a body that reached the
    /// client kit in several reads came back as its last piece. The kit now hands the body over once, whole.
    @Test("a body that reaches the client in parts comes back whole", arguments: [5_000, 300_000])
    func aBodyInPartsComesBackWhole(size: Int) throws {
        let body = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        let head = Array("HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: \(size)\r\n\r\n".utf8)
        let parts: RecordingOrigin.Handler = { _ in
            .pieces([head + body[0..<(size / 3)], Array(body[(size / 3)...])], pause: .milliseconds(50), thenClose: false)
        }
        try Self.withProxy(origin: parts) { _, _, origin, session throws in
            let data = try fetch(session, URLRequest(url: URL(string: origin.url("/img/parts.jpg"))!)).get()
            #expect(data.count == size)
            #expect(data == Data(body))
        }
    }

    @Test("adaptiveLoader, constrained mode: a URLError with reason .constrained, then the low-res image")
    func adaptiveConstrained() throws {
        try Self.withProxy { _, admin, origin, session throws in
            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            var request = URLRequest(url: URL(string: origin.url("/img/hero.jpg"))!)
            request.dataModeAllowsConstrainedNetworkAccess = false
            guard case .failure(let error) = fetch(session, request) else {
                Issue.record("a constrained request must fail")
                return
            }
            let urlError = try #require(error as? URLError)
            #expect(urlError.code == .notConnectedToInternet)
            #expect(urlError.dataModeUnavailableReason == .constrained)

            let (data, usedLowRes) = try adaptiveLoad(session, full: URL(string: origin.url("/img/hero.jpg"))!,
                                                      low: URL(string: origin.url("/img/hero@small.jpg"))!)
            #expect(usedLowRes)
            #expect(data == Data(Self.low.utf8))
            #expect(origin.requests.map(\.head.target) == ["/img/hero@small.jpg"], "nothing of the full image went upstream")
        }
    }

    @Test("expensive and ultra-constrained map to their reasons; an allowed request passes in the same mode")
    func otherReasons() throws {
        try Self.withProxy { _, admin, origin, session throws in
            #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
            var request = URLRequest(url: URL(string: origin.url("/video.mp4"))!)
            request.dataModeAllowsExpensiveNetworkAccess = false
            if case .failure(let error as URLError) = fetch(session, request) {
                #expect(error.dataModeUnavailableReason == .expensive)
            } else {
                Issue.record("expected a URLError")
            }
            #expect((try? fetch(session, URLRequest(url: URL(string: origin.url("/ok"))!)).get()) != nil)
            #expect(try admin.put("/mode", #"{"mode": "ultra-constrained"}"#).status == 200)
            if case .failure(let error as URLError) = fetch(session, URLRequest(url: URL(string: origin.url("/sat"))!)) {
                #expect(error.dataModeUnavailableReason == .ultraConstrained, "ultra-constrained is opt-in")
            } else {
                Issue.record("expected a URLError")
            }
        }
    }

    @Test("the path monitor sees the current mode, then a flip, through /events with the read token")
    func pathMonitor() throws {
        let config = "admin: {token: full-power, read-token: look-only}\n"
        try Self.withProxy(config: config) { proxy, _, _, _ throws in
            let admin = AdminAPIClient(port: proxy.adminPort, token: "full-power")
            let updates = Mutex<[(DataModePath, Date)]>([])
            let monitor = DataModePathMonitor(adminURL: URL(string: "http://127.0.0.1:\(proxy.adminPort)")!, token: "look-only")
            monitor.pathUpdateHandler = { path in updates.withLock { $0.append((path, Date())) } }
            monitor.start()
            defer { monitor.cancel() }
            #expect(waitFor { updates.withLock { !$0.isEmpty } }, "the current mode arrives first")
            #expect(monitor.currentPath.isConstrained == false)

            let asked = Date()
            #expect(try admin.put("/mode", #"{"mode": "constrained-expensive"}"#).status == 200)
            let flipped = Date()  // the mode is applied (and emitted) just before the PUT is answered
            #expect(waitFor { updates.withLock { $0.contains { $0.0.isConstrained } } }, "the update handler reports the flip")
            #expect(monitor.currentPath.isConstrained)
            let seen = updates.withLock { $0.first { $0.0.isConstrained }?.1 } ?? .distantFuture
            let latency = seen.timeIntervalSince(flipped)
            // SPEC §14 asks for 100 ms; the machine under test is shared, so the assertion is generous and the
            // latency is reported.
            print("path monitor: mode flip seen \(Int(latency * 1000)) ms after the PUT was answered, "
                  + "\(Int(seen.timeIntervalSince(asked) * 1000)) ms after it was sent (the PUT's fsync included)")
            #expect(latency < 1.0)
            #expect(monitor.currentPath.isExpensive)
            #expect(!monitor.currentPath.isUltraConstrained)
            // The read token cannot change anything.
            #expect(try AdminAPIClient(port: proxy.adminPort, token: "look-only").put("/mode", #"{"mode": "normal"}"#).status == 401)
        }
    }
}

/// Polls `condition` every 10 ms for up to `seconds`.
func waitFor(seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        Thread.sleep(forTimeInterval: 0.01)
    }
    return condition()
}

/// The README's runnable example (`swift run datamode-client-example FULL LOW`), built with the package: the same
/// pattern from a separate program, against the real proxy in normal and constrained modes.
@Suite struct ClientKitExampleTests {
    @Test func theExampleFallsBackInConstrainedMode() throws {
        let example = URL(fileURLWithPath: ProxyProcess.binaryPath).deletingLastPathComponent()
            .appendingPathComponent("datamode-client-example").path
        #expect(FileManager.default.isExecutableFile(atPath: example), "swift build builds the example target")
        let origin = try RecordingOrigin { request in .ok(request.target == "/full.jpg" ? String(repeating: "F", count: 5000) : "small") }
        defer { origin.stop() }
        let proxy = try ProxyProcess()
        defer { proxy.stop() }
        let arguments = [origin.url("/full.jpg"), origin.url("/low.jpg"), "--proxy", "127.0.0.1:\(proxy.port)"]

        let normal = try ExternalCommand.run(example, arguments, environment: ["PATH": "/usr/bin:/bin"], timeout: 60)
        #expect(normal.status == 0 && normal.stdout == "full: 5000 bytes\n", "\(normal.output)")
        #expect(try AdminAPIClient(port: proxy.adminPort).put("/mode", #"{"mode": "constrained"}"#).status == 200)
        let constrained = try ExternalCommand.run(example, arguments, environment: ["PATH": "/usr/bin:/bin"], timeout: 60)
        #expect(constrained.status == 0 && constrained.stdout == "low-res (constrained): 5 bytes\n", "\(constrained.output)")
        #expect(origin.requests.map(\.target) == ["/full.jpg", "/low.jpg"], "the refused full-size request never left")
    }
}
