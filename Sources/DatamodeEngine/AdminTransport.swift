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
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// The admin listener: libevent's evhttp on the control loop (SPEC §7, a separate listener from the proxy's).
/// evhttp's parser is lax (see SWIFT-LIBEVENT-NOTES), which is acceptable for a loopback control API with
/// small JSON bodies; the proxied traffic never goes through it.
public final class AdminTransport {
    private let http: OpaquePointer
    private let handler: (AdminRequest) -> AdminResponse
    public private(set) var listenAddress: ListenAddress

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
        evhttp_free(http)
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
