import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The network as the proxy's data mode describes it, like `NWPath`.
public struct DataModePath: Sendable, Equatable {
    /// Low Data Mode (`NWPath.isConstrained`).
    public var isConstrained: Bool
    /// Cellular or hotspot (`NWPath.isExpensive`).
    public var isExpensive: Bool
    /// A satellite-class link (`NWPath.isUltraConstrained`).
    public var isUltraConstrained: Bool
    /// The proxy's mode name (`normal`, `constrained`, …).
    public var mode: String

    public init(isConstrained: Bool = false, isExpensive: Bool = false, isUltraConstrained: Bool = false, mode: String = "normal") {
        self.isConstrained = isConstrained
        self.isExpensive = isExpensive
        self.isUltraConstrained = isUltraConstrained
        self.mode = mode
    }
}

/// Follows the proxy's `GET /events` stream (SPEC §12) and reports the mode as a path, like `NWPathMonitor`:
///
/// ```swift
/// let monitor = DataModePathMonitor(adminURL: URL(string: "http://127.0.0.1:8878")!, token: readToken)
/// monitor.pathUpdateHandler = { path in print(path.isConstrained) }
/// monitor.start()
/// ```
///
/// `token` is `admin.read-token` (or `admin.token`) when the proxy has one. `session` follows one session's mode
/// instead of the global one. The stream is reopened a second after it breaks, until `cancel()`.
public final class DataModePathMonitor: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    public let adminURL: URL
    public let token: String?
    public let sessionID: String?
    private let lock = NSLock()
    private var path = DataModePath()
    private var handler: (@Sendable (DataModePath) -> Void)?
    private var urlSession: URLSession?
    private var buffer = Data()
    private var cancelled = false
    private let queue: DispatchQueue

    public init(adminURL: URL, token: String? = nil, session: String? = nil, queue: DispatchQueue = DispatchQueue(label: "datamode.path-monitor")) {
        self.adminURL = adminURL
        self.token = token
        self.sessionID = session
        self.queue = queue
    }

    /// Called on the monitor's queue with each new path (the first one when the stream opens).
    public var pathUpdateHandler: (@Sendable (DataModePath) -> Void)? {
        get { lock.lock(); defer { lock.unlock() }; return handler }
        set { lock.lock(); handler = newValue; lock.unlock() }
    }

    /// The latest path (all false before the first event).
    public var currentPath: DataModePath { lock.lock(); defer { lock.unlock() }; return path }
    public var isConstrained: Bool { currentPath.isConstrained }
    public var isExpensive: Bool { currentPath.isExpensive }
    public var isUltraConstrained: Bool { currentPath.isUltraConstrained }

    public func start() {
        lock.lock()
        cancelled = false
        lock.unlock()
        connect()
    }

    public func cancel() {
        lock.lock()
        cancelled = true
        let session = urlSession
        urlSession = nil
        lock.unlock()
        session?.invalidateAndCancel()
    }

    private func connect() {
        var components = URLComponents(url: adminURL.appendingPathComponent("events"), resolvingAgainstBaseURL: false)!
        if let sessionID { components.queryItems = [URLQueryItem(name: "session", value: sessionID)] }
        var request = URLRequest(url: components.url!)
        request.timeoutInterval = 24 * 3600
        request.setValue("text/event-stream", forHTTPHeaderField: "Accept")
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        let configuration = URLSessionConfiguration.ephemeral
        configuration.connectionProxyDictionary = [:]  // the admin API is reached directly
        configuration.timeoutIntervalForRequest = 24 * 3600
        configuration.timeoutIntervalForResource = 24 * 3600
        let operations = OperationQueue()
        operations.maxConcurrentOperationCount = 1
        let session = URLSession(configuration: configuration, delegate: self, delegateQueue: operations)
        lock.lock()
        guard !cancelled else { lock.unlock(); return }
        urlSession = session
        buffer = Data()
        lock.unlock()
        session.dataTask(with: request).resume()
    }

    public func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        lock.lock()
        buffer.append(data)
        var events: [(String, String)] = []
        let separator = Data("\n\n".utf8)
        while let range = buffer.range(of: separator) {
            let block = String(decoding: buffer[buffer.startIndex..<range.lowerBound], as: UTF8.self)
            buffer.removeSubrange(buffer.startIndex..<range.upperBound)
            var type = "message"
            var payload = ""
            for line in block.split(separator: "\n") {
                if line.hasPrefix("event:") { type = line.dropFirst(6).trimmingCharacters(in: .whitespaces) }
                if line.hasPrefix("data:") { payload = line.dropFirst(5).trimmingCharacters(in: .whitespaces) }
            }
            events.append((type, payload))
        }
        lock.unlock()
        for (type, payload) in events where type == "mode" { apply(payload) }
    }

    private func apply(_ payload: String) {
        guard let object = try? JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any] else { return }
        let scope = object["scope"] as? String ?? "global"
        guard scope == (sessionID ?? "global") else { return }
        let next = DataModePath(isConstrained: object["constrained"] as? Bool ?? false,
                                isExpensive: object["expensive"] as? Bool ?? false,
                                isUltraConstrained: object["ultraConstrained"] as? Bool ?? false,
                                mode: object["mode"] as? String ?? "normal")
        lock.lock()
        path = next
        let handler = handler
        lock.unlock()
        if let handler { queue.async { handler(next) } }
    }

    public func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        lock.lock()
        let again = !cancelled && urlSession === session
        if again { urlSession = nil }
        lock.unlock()
        session.finishTasksAndInvalidate()
        guard again else { return }
        queue.asyncAfter(deadline: .now() + 1) { [weak self] in self?.connect() }
    }
}
