import CLibevent
import DatamodeConfig
#if canImport(Glibc)
import Glibc
#endif

/// An admin API request, as plain Swift values (no C type leaves the engine).
public struct AdminRequest: Sendable {
    public var method: String
    /// The path, percent-decoding left to the router; without the query.
    public var path: String
    public var query: String?
    /// Header names lowercased.
    public var headers: [String: String]
    public var body: [UInt8]
    public init(method: String, path: String, query: String? = nil, headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }
}

public struct AdminResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// Set for an event stream (SPEC §12 `GET /events`): the reply stays open after `body`, and every event
    /// published for `stream.scope` (all of them when nil) is appended to it.
    public var stream: AdminStream?
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = [], stream: AdminStream? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
    }
}

/// An open event stream's filter.
public struct AdminStream: Sendable {
    /// Only events of this scope (a session id, or `global`); nil = every event.
    public var scope: String?
    public init(scope: String?) { self.scope = scope }
}

/// One open `GET /events` reply.
final class EventSubscriber {
    let request: OpaquePointer
    let connection: OpaquePointer
    let scope: String?
    unowned let transport: AdminTransport
    init(request: OpaquePointer, connection: OpaquePointer, scope: String?, transport: AdminTransport) {
        self.request = request
        self.connection = connection
        self.scope = scope
        self.transport = transport
    }
}

/// The admin listener: libevent's evhttp on the control loop (SPEC §7, a separate listener from the proxy's).
/// evhttp's parser is lax (see SWIFT-LIBEVENT-NOTES), which is acceptable for a loopback control API with
/// small JSON bodies; the proxied traffic never goes through it.
public final class AdminTransport {
    private let http: OpaquePointer
    private let handler: (AdminRequest) -> AdminResponse
    public private(set) var listenAddress: ListenAddress
    /// Open event streams, by connection. Only the control loop's thread touches them.
    private var subscribers: [OpaquePointer: EventSubscriber] = [:]
    /// The most bytes queued for one subscriber: beyond it, the subscriber has stopped reading and is dropped
    /// (SPEC §12: never buffered without bound). An event is a few hundred bytes.
    public static let subscriberBacklogLimit = 64 << 10
    /// Event streams open now.
    public var subscriberCount: Int { subscribers.count }
    /// Subscribers dropped for not reading.
    public private(set) var droppedSubscribers = 0

    public init(loop: ControlLoop, address: ListenAddress, handler: @escaping (AdminRequest) -> AdminResponse) throws(EngineError) {
        guard let http = evhttp_new(loop.base) else { throw EngineError("evhttp_new failed") }
        self.http = http
        self.handler = handler
        self.listenAddress = address
        evhttp_set_max_body_size(http, 1 << 20)
        evhttp_set_max_headers_size(http, 64 << 10)
        evhttp_set_timeout(http, 30)
        evhttp_set_allowed_methods(http, UInt16(EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_PUT.rawValue | EVHTTP_REQ_DELETE.rawValue
            | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue | EVHTTP_REQ_OPTIONS.rawValue | EVHTTP_REQ_PATCH.rawValue
            | EVHTTP_REQ_TRACE.rawValue | EVHTTP_REQ_CONNECT.rawValue))
        guard let handle = evhttp_bind_socket_with_handle(http, address.host, address.port) else {
            // Every stored property is set, so `deinit` runs after this throw and frees `http` (freeing it
            // here as well was a double free).
            throw EngineError("cannot listen on admin address \(address): \(String(cString: strerror(errno)))")
        }
        let fd = evhttp_bound_socket_get_fd(handle)
        if let local = SocketAddress.local(of: fd) {
            listenAddress = ListenAddress(address: address.address, port: local.port)
        }
        evhttp_set_gencb(http, adminRequestCallback, context(self))
    }

    deinit {
        // evhttp_free frees every connection and calls their close callbacks: forget the subscribers first.
        let open = Array(subscribers.keys)
        subscribers = [:]
        for connection in open { evhttp_connection_set_closecb(connection, nil, nil) }
        evhttp_free(http)
    }

    /// Appends `bytes` to every event stream whose filter takes `scope` (nil: every stream, as a heartbeat).
    /// Control loop thread only. A stream whose backlog is over `subscriberBacklogLimit` is closed instead.
    public func publish(scope: String?, _ bytes: [UInt8]) {
        guard !subscribers.isEmpty else { return }
        var slow: [EventSubscriber] = []
        for subscriber in subscribers.values {
            if let scope, let filter = subscriber.scope, filter != scope { continue }
            if let bev = evhttp_connection_get_bufferevent(subscriber.connection),
               evbuffer_get_length(bufferevent_get_output(bev)) + bytes.count > Self.subscriberBacklogLimit {
                slow.append(subscriber)
                continue
            }
            let buffer = evbuffer_new()!
            evbuffer_add(buffer, bytes, bytes.count)
            evhttp_send_reply_chunk(subscriber.request, buffer)
            evbuffer_free(buffer)
        }
        for subscriber in slow {
            droppedSubscribers += 1
            subscribers.removeValue(forKey: subscriber.connection)
            evhttp_connection_set_closecb(subscriber.connection, nil, nil)
            evhttp_connection_free(subscriber.connection)
        }
    }

    /// The stream's connection closed (the client left, or evhttp gave up on it).
    func subscriberClosed(_ connection: OpaquePointer) {
        subscribers.removeValue(forKey: connection)
    }

    private func startStream(_ request: OpaquePointer, _ response: AdminResponse, _ stream: AdminStream) {
        guard let connection = evhttp_request_get_connection(request) else { return }
        let outputHeaders = evhttp_request_get_output_headers(request)
        for (name, value) in response.headers { evhttp_add_header(outputHeaders, name, value) }
        evhttp_send_reply_start(request, Int32(response.status), Self.reason(response.status))
        let subscriber = EventSubscriber(request: request, connection: connection, scope: stream.scope, transport: self)
        subscribers[connection] = subscriber
        evhttp_connection_set_closecb(connection, adminStreamClosedCallback, context(subscriber))
        // A stream is idle by design: evhttp's read and write timeouts would cut it. A dead or stalled reader
        // is found by the heartbeat and the backlog limit instead.
        evhttp_connection_set_timeout(connection, -1)
        // A small kernel send buffer too: a reader that stops shows up in the backlog after tens of KiB, not after
        // the megabytes loopback autotuning would otherwise queue in the kernel for it.
        if let bev = evhttp_connection_get_bufferevent(connection) {
            var size = Int32(Self.subscriberBacklogLimit)
            _ = setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        if !response.body.isEmpty {
            let buffer = evbuffer_new()!
            evbuffer_add(buffer, response.body, response.body.count)
            evhttp_send_reply_chunk(request, buffer)
            evbuffer_free(buffer)
        }
    }

    func handle(_ request: OpaquePointer) {
        let method: String
        switch evhttp_request_get_command(request) {
        case EVHTTP_REQ_GET: method = "GET"
        case EVHTTP_REQ_PUT: method = "PUT"
        case EVHTTP_REQ_DELETE: method = "DELETE"
        case EVHTTP_REQ_POST: method = "POST"
        case EVHTTP_REQ_HEAD: method = "HEAD"
        case EVHTTP_REQ_PATCH: method = "PATCH"
        case EVHTTP_REQ_OPTIONS: method = "OPTIONS"
        case EVHTTP_REQ_TRACE: method = "TRACE"
        case EVHTTP_REQ_CONNECT: method = "CONNECT"
        default: method = "OTHER"
        }
        let uri = evhttp_request_get_uri(request).map { String(cString: $0) } ?? "/"
        let (path, query): (String, String?) = {
            guard let mark = uri.firstIndex(of: "?") else { return (uri, nil) }
            return (String(uri[..<mark]), String(uri[uri.index(after: mark)...]))
        }()
        var headers: [String: String] = [:]
        if let list = evhttp_request_get_input_headers(request) {
            var entry = list.pointee.tqh_first
            while let current = entry {
                if let key = current.pointee.key, let value = current.pointee.value {
                    headers[String(cString: key).lowercased()] = String(cString: value)
                }
                entry = current.pointee.next.tqe_next
            }
        }
        var body: [UInt8] = []
        if let input = evhttp_request_get_input_buffer(request) {
            let length = evbuffer_get_length(input)
            if length > 0 {
                body = [UInt8](repeating: 0, count: length)
                _ = evbuffer_remove(input, &body, length)
            }
        }
        let response = handler(AdminRequest(method: method, path: path, query: query, headers: headers, body: body))
        if let stream = response.stream, method == "GET" {
            startStream(request, response, stream)
            return
        }
        let outputHeaders = evhttp_request_get_output_headers(request)
        for (name, value) in response.headers { evhttp_add_header(outputHeaders, name, value) }
        let buffer = evbuffer_new()!
        if method != "HEAD" && !response.body.isEmpty { evbuffer_add(buffer, response.body, response.body.count) }
        evhttp_send_reply(request, Int32(response.status), Self.reason(response.status), buffer)
        evbuffer_free(buffer)
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 201: "Created"
        case 204: "No Content"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 409: "Conflict"
        case 413: "Payload Too Large"
        case 500: "Internal Server Error"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }
}
