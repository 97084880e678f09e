// The client kit (SPEC §14): app code written for Low Data Mode runs unchanged against datamode-proxy.
// Foundation only (FoundationNetworking on Linux); no dependency on the proxy's own modules.
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Why the network refused a request: the twin of `URLError.NetworkUnavailableReason`, on every platform. The raw
/// values are Apple's, so the same user-info number reads the same on both sides.
public enum DataModeUnavailableReason: Int, Sendable, Equatable {
    case cellular = 0
    case expensive = 1
    case constrained = 2
    case ultraConstrained = 3

    /// The proxy's `Network-Unavailable-Reason` / problem `error` value.
    init?(proxyCode: String) {
        switch proxyCode {
        case "constrained": self = .constrained
        case "expensive": self = .expensive
        case "ultra-constrained": self = .ultraConstrained
        default: return nil
        }
    }
}

extension URLError {
    /// The user-info key Apple's Foundation reads `networkUnavailableReason` from (`NSURLErrorNetworkUnavailableReasonKey`).
    public static let dataModeUnavailableReasonKey = "NSURLErrorNetworkUnavailableReasonKey"

    /// Why the network refused the request, if it did: the ONE accessor that reads the same on Linux and on Apple
    /// platforms (where `networkUnavailableReason` reads the same user-info entry).
    public var dataModeUnavailableReason: DataModeUnavailableReason? {
        guard let value = userInfo[URLError.dataModeUnavailableReasonKey] else { return nil }
        if let number = value as? Int { return DataModeUnavailableReason(rawValue: number) }
        if let number = value as? NSNumber { return DataModeUnavailableReason(rawValue: number.intValue) }
        return nil
    }
}

extension URLRequest {
    /// The explicit per-request override of `allowsConstrainedNetworkAccess`, for platforms whose Foundation lacks
    /// it (Linux); sent as `Allow-Constrained`. On Apple platforms, prefer `allowsConstrainedNetworkAccess`.
    public var dataModeAllowsConstrainedNetworkAccess: Bool? {
        get { value(forHTTPHeaderField: "Allow-Constrained").flatMap(DataModeTags.parse) }
        set { setValue(newValue.map(DataModeTags.text), forHTTPHeaderField: "Allow-Constrained") }
    }

    /// As `dataModeAllowsConstrainedNetworkAccess`, for `Allow-Expensive`.
    public var dataModeAllowsExpensiveNetworkAccess: Bool? {
        get { value(forHTTPHeaderField: "Allow-Expensive").flatMap(DataModeTags.parse) }
        set { setValue(newValue.map(DataModeTags.text), forHTTPHeaderField: "Allow-Expensive") }
    }

    /// As `dataModeAllowsConstrainedNetworkAccess`, for `Allow-Ultra-Constrained` (opt-in: false unless set).
    public var dataModeAllowsUltraConstrainedNetworkAccess: Bool? {
        get { value(forHTTPHeaderField: "Allow-Ultra-Constrained").flatMap(DataModeTags.parse) }
        set { setValue(newValue.map(DataModeTags.text), forHTTPHeaderField: "Allow-Ultra-Constrained") }
    }
}

enum DataModeTags {
    static func text(_ flag: Bool) -> String { flag ? "?1" : "?0" }
    static func parse(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "?1", "true", "1": true
        case "?0", "false", "0": false
        default: nil
        }
    }
}

/// Where the proxy is and what a configuration allows, as `DataModeURLProtocol.install(on:)` recorded it.
public struct DataModeClientSettings: Sendable, Equatable {
    public var proxyHost: String
    public var proxyPort: Int
    /// The configuration-level permissions (Apple: copied from the `URLSessionConfiguration` at install time).
    public var allowsConstrainedNetworkAccess: Bool
    public var allowsExpensiveNetworkAccess: Bool
    public var allowsUltraConstrainedNetworkAccess: Bool

    public init(proxyHost: String = "127.0.0.1", proxyPort: Int = 8877, allowsConstrainedNetworkAccess: Bool = true,
                allowsExpensiveNetworkAccess: Bool = true, allowsUltraConstrainedNetworkAccess: Bool = false) {
        self.proxyHost = proxyHost
        self.proxyPort = proxyPort
        self.allowsConstrainedNetworkAccess = allowsConstrainedNetworkAccess
        self.allowsExpensiveNetworkAccess = allowsExpensiveNetworkAccess
        self.allowsUltraConstrainedNetworkAccess = allowsUltraConstrainedNetworkAccess
    }
}

/// A `URLProtocol` that sends a request through datamode-proxy with its data-mode tags, and turns the proxy's
/// rejection into the error URLSession gives on a constrained path:
///
/// ```swift
/// let configuration = URLSessionConfiguration.default
/// DataModeURLProtocol.install(on: configuration, proxyHost: "127.0.0.1", proxyPort: 8877)
/// let session = URLSession(configuration: configuration)
/// ```
///
/// The tags come from the request's and the configuration's `allows…NetworkAccess` where the platform has them,
/// else from `URLRequest.dataModeAllows…NetworkAccess` and the settings. The settings are per process (a
/// `URLProtocol` class cannot see the session that runs it): one proxy per process, as apps have.
public final class DataModeURLProtocol: URLProtocol {
    private static let state = NSLock()
    nonisolated(unsafe) private static var current = DataModeClientSettings()
    private static let handledKey = "DataModeURLProtocolHandled"

    /// The settings in force.
    public static var settings: DataModeClientSettings {
        get { state.lock(); defer { state.unlock() }; return current }
        set { state.lock(); current = newValue; state.unlock() }
    }

    /// Registers the protocol on `configuration` and records the proxy and the configuration's permissions.
    public static func install(on configuration: URLSessionConfiguration, proxyHost: String, proxyPort: Int,
                               allowsUltraConstrainedNetworkAccess: Bool = false) {
        var settings = DataModeClientSettings(proxyHost: proxyHost, proxyPort: proxyPort,
                                              allowsUltraConstrainedNetworkAccess: allowsUltraConstrainedNetworkAccess)
        #if canImport(Darwin)
        if #available(macOS 10.15, iOS 13.0, tvOS 13.0, watchOS 6.0, *) {
            settings.allowsConstrainedNetworkAccess = configuration.allowsConstrainedNetworkAccess
            settings.allowsExpensiveNetworkAccess = configuration.allowsExpensiveNetworkAccess
        }
        #endif
        self.settings = settings
        configuration.protocolClasses = [DataModeURLProtocol.self] + (configuration.protocolClasses ?? [])
    }

    public override class func canInit(with request: URLRequest) -> Bool {
        guard let scheme = request.url?.scheme?.lowercased(), scheme == "http" || scheme == "https" else { return false }
        return URLProtocol.property(forKey: handledKey, in: request) == nil
    }

    public override class func canonicalRequest(for request: URLRequest) -> URLRequest { request }

    private var inner: URLSession?
    private var rejection: (status: Int, reason: DataModeUnavailableReason, body: Data)?

    /// The request as sent to the proxy: the tags resolved, marked so this protocol does not take it again.
    static func tagged(_ request: URLRequest, settings: DataModeClientSettings) -> URLRequest {
        var out = request
        var constrained = settings.allowsConstrainedNetworkAccess
        var expensive = settings.allowsExpensiveNetworkAccess
        #if canImport(Darwin)
        if #available(macOS 10.15, iOS 13.0, tvOS 13.0, watchOS 6.0, *) {
            constrained = constrained && request.allowsConstrainedNetworkAccess
            expensive = expensive && request.allowsExpensiveNetworkAccess
        }
        #endif
        // An explicit per-request value wins (the only per-request form on Linux).
        if let explicit = request.dataModeAllowsConstrainedNetworkAccess { constrained = explicit }
        if let explicit = request.dataModeAllowsExpensiveNetworkAccess { expensive = explicit }
        let ultra = request.dataModeAllowsUltraConstrainedNetworkAccess ?? settings.allowsUltraConstrainedNetworkAccess
        out.dataModeAllowsConstrainedNetworkAccess = constrained
        out.dataModeAllowsExpensiveNetworkAccess = expensive
        out.dataModeAllowsUltraConstrainedNetworkAccess = ultra
        return out
    }

    #if !canImport(Darwin)
    private var exchange: ProxyExchange?
    #endif

    public override func startLoading() {
        let settings = Self.settings
        let tagged = Self.tagged(request, settings: settings)
        #if !canImport(Darwin)
        // swift-corelibs-foundation ignores `connectionProxyDictionary`: an `http://` request is sent to the proxy
        // by this protocol itself. (`https://` goes through URLSession, which reaches the proxy only through
        // libcurl's `https_proxy` environment variable.)
        if tagged.url?.scheme?.lowercased() == "http" {
            let exchange = ProxyExchange(request: tagged, proxyHost: settings.proxyHost, proxyPort: settings.proxyPort)
            self.exchange = exchange
            let url = tagged.url!
            let owner = UncheckedBox(self)
            Thread.detachNewThread {
                let self_ = owner.value
                // swift-corelibs-foundation's `urlProtocol(_:didLoad:)` replaces a completion handler's data instead
                // of appending to it: the body is handed over once, whole (a delegate then gets it in one piece).
                var body = Data()
                do {
                    try exchange.run(head: { head in
                        var fields: [String: String] = [:]
                        for (name, value) in head.fields {
                            fields[name] = fields[name].map { $0 + ", " + value } ?? value
                        }
                        if let response = HTTPURLResponse(url: url, statusCode: head.status, httpVersion: "HTTP/1.1",
                                                          headerFields: fields) {
                            _ = self_.received(response)
                        }
                    }, body: { data in body.append(data) })
                    if !body.isEmpty { self_.received(body) }
                    self_.completed(nil)
                } catch is CancellationError {
                    return
                } catch {
                    self_.completed(URLError(.networkConnectionLost, userInfo: [NSLocalizedDescriptionKey: "\(error)"]))
                }
            }
            return
        }
        #endif
        let mutable = (tagged as NSURLRequest).mutableCopy() as! NSMutableURLRequest
        URLProtocol.setProperty(true, forKey: Self.handledKey, in: mutable)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.protocolClasses = []
        configuration.connectionProxyDictionary = [
            "HTTPEnable": true, "HTTPProxy": settings.proxyHost, "HTTPPort": settings.proxyPort,
            "HTTPSEnable": true, "HTTPSProxy": settings.proxyHost, "HTTPSPort": settings.proxyPort,
        ]
        let delegate = InnerDelegate(owner: self)
        let session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)
        inner = session
        let request = mutable as URLRequest
        // Not on the calling (outer session's) queue: with swift-corelibs-foundation, every session's work queue
        // targets one serial queue, so starting a task of the inner session from there waits on itself.
        DispatchQueue.global().async { session.dataTask(with: request).resume() }
    }

    public override func stopLoading() {
        #if !canImport(Darwin)
        exchange?.cancel()
        #endif
        // Not from inside the inner session's callbacks, whose queue its invalidation waits for.
        if let session = inner { DispatchQueue.global().async { session.invalidateAndCancel() } }
        inner = nil
    }

    /// The proxy's rejection (SPEC §4): `403` with `Network-Unavailable-Reason`.
    fileprivate func received(_ response: URLResponse) -> Bool {
        if let http = response as? HTTPURLResponse, http.statusCode == 403,
           let header = http.value(forHTTPHeaderField: "Network-Unavailable-Reason"),
           let reason = DataModeUnavailableReason(proxyCode: header.trimmingCharacters(in: .whitespaces)) {
            rejection = (http.statusCode, reason, Data())
            return false
        }
        client?.urlProtocol(self, didReceive: response, cacheStoragePolicy: .notAllowed)
        return true
    }

    fileprivate func received(_ data: Data) {
        if rejection != nil {
            rejection!.body.append(data)
        } else {
            client?.urlProtocol(self, didLoad: data)
        }
    }

    fileprivate func completed(_ error: Error?) {
        if let rejection {
            var info: [String: Any] = [URLError.dataModeUnavailableReasonKey: NSNumber(value: rejection.reason.rawValue),
                                       NSLocalizedDescriptionKey: "The network connection is \(rejection.reason) (datamode-proxy)."]
            if let url = request.url { info[NSURLErrorFailingURLErrorKey] = url }
            if let problem = try? JSONSerialization.jsonObject(with: rejection.body) as? [String: Any] {
                info["DataModeProblem"] = problem
            }
            client?.urlProtocol(self, didFailWithError: URLError(.notConnectedToInternet, userInfo: info))
        } else if let error {
            client?.urlProtocol(self, didFailWithError: error)
        } else {
            client?.urlProtocolDidFinishLoading(self)
        }
    }
}

/// The inner session's delegate (weakly tied to its protocol instance).
private final class InnerDelegate: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    weak var owner: DataModeURLProtocol?
    init(owner: DataModeURLProtocol) { self.owner = owner }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping (URLSession.ResponseDisposition) -> Void) {
        _ = owner?.received(response)
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        owner?.received(data)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        owner?.completed(error)
    }

    // Redirects are the app's business: hand the 3xx back unfollowed, as the outer session decides.
    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void) {
        completionHandler(nil)
    }
}

/// Hands the protocol instance to the thread that runs its exchange: URLProtocol is not Sendable, but the client
/// callbacks it makes are made from one thread at a time (the exchange's), as URLSession's own loaders do.
private struct UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
