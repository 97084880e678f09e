import CLibevent
import DatamodeConfig
import DatamodeState
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One open `GET /events` reply, and the events not yet handed to it.
///
/// What the proxy holds for a stream is what is queued here and the one batch evhttp is writing (`inFlight`): the
/// next batch is handed over only once that one is all in the socket's send buffer (evhttp's write callback). Both
/// are counted in bytes of memory, not of payload (`AdminTransport.queuedEventOverhead`, `.batchOverhead`). Before
/// (issue 24), every event went to the connection's output as a chunk of its own, each in an evbuffer chain of at
/// least 1 KiB: the 64 KiB the limit counted were ~330 events and held ~350 KB.
final class EventSubscriber {
    let request: OpaquePointer
    let connection: OpaquePointer
    let scope: String?
    unowned let transport: AdminTransport
    /// Events not handed to evhttp yet, oldest first. An event's bytes are one array, shared by every queue it is in.
    var queue: [[UInt8]] = []
    /// What `queue` costs.
    var queued = 0
    /// What the batch evhttp is writing costs; 0 once it is all in the socket's send buffer.
    var inFlight = 0
    /// What the proxy holds for this stream, in bytes.
    var held: Int { queued + inFlight }
    init(request: OpaquePointer, connection: OpaquePointer, scope: String?, transport: AdminTransport) {
        self.request = request
        self.connection = connection
        self.scope = scope
        self.transport = transport
    }
}

/// What one admin connection has sent, counted so that a request larger than `AdminTransport.maxRequestBytes` gets
/// the admin API's own `413` problem (SPEC §7: problem+json errors) and not evhttp's: libevent 2.1's evhttp answers
/// a body over its limit with an HTML page of its own and has no hook to change it (`evhttp_set_errorcb` is 2.2's),
/// so its body limit is off and this one is kept in front of it instead.
///
/// evhttp hands a request over only whole (`AdminTransport.handle`), which moves `requestStart` past it: what was
/// read beyond that point is the request being read. One that had passed the limit before a read and is still not
/// whole is refused at that read, so evhttp never holds more of it than the limit and one read.
final class AdminIntake {
    unowned let transport: AdminTransport
    /// The connection's bufferevent, made for evhttp (`AdminTransport.makeBufferevent`).
    let bev: OpaquePointer
    /// The callback on its input that counts what is read.
    var counter: OpaquePointer?
    /// Bytes read from the connection so far.
    var received = 0
    /// Where, in those bytes, the request being read begins.
    var requestStart = 0
    /// The connection was taken from evhttp to refuse a request too large (`AdminTransport.refuse`): evhttp's
    /// connection, freed once the refusal is written and the client stopped sending (or gave up reading).
    var refusing: OpaquePointer?
    /// The refusal is written: what still comes is read and dropped until the client closes.
    var refusalWritten = false
    /// Bytes dropped since the refusal (`AdminTransport.maxDroppedBytes` at most).
    var dropped = 0
    init(transport: AdminTransport, bev: OpaquePointer) {
        self.transport = transport
        self.bev = bev
    }
}

/// The admin listener: libevent's evhttp on the control loop (SPEC §7, a separate listener from the proxy's).
/// evhttp's parser is lax (see SWIFT-LIBEVENT-NOTES), which is acceptable for a loopback control API with
/// small JSON bodies; the proxied traffic never goes through it.
public final class AdminTransport {
    private let http: OpaquePointer
    private let handler: (AdminRequest) -> AdminResponse
    public private(set) var listenAddress: ListenAddress
    /// The answer to a request larger than `maxRequestBytes` (the admin API's problem; the transport sends it).
    private let tooLarge: AdminResponse
    /// The largest admin request, its head and body as sent (framing included): the admin API takes small JSON
    /// bodies. Larger ones are answered `tooLarge` (`AdminIntake`).
    public static let maxRequestBytes = 1 << 20
    /// The most a refused connection may still send, dropped, before it is closed all the same: reading on after a
    /// refusal is for the client to get it, not for a client that never stops.
    static let maxDroppedBytes = 16 << 20
    /// Every open connection's intake, by its bufferevent.
    private var intakes: [OpaquePointer: AdminIntake] = [:]
    /// Open event streams, by connection. Only the control loop's thread touches them.
    private var subscribers: [OpaquePointer: EventSubscriber] = [:]
    /// The most memory held for one subscriber, in bytes (`EventSubscriber.held`): an event that would take it
    /// beyond this means the subscriber has stopped reading, and it is dropped (SPEC §12: never buffered without
    /// bound). An event is a few hundred bytes.
    public static let subscriberBacklogLimit = 64 << 10
    /// What a queued event costs besides its bytes: its slot in the queue. (Its bytes are shared with the other
    /// queues, but counted in each: what one stream holds does not depend on the others.)
    static let queuedEventOverhead = MemoryLayout<[UInt8]>.stride
    /// What libevent adds around a batch in the connection's output: the chunk-size line and the CRLF after the
    /// batch each take a chain of their own (a chain is at least 1 KiB, and the chain that references the batch
    /// cannot be appended to), plus that chain and malloc's headers.
    static let batchOverhead = 2 * 1024 + 256
    /// Event streams open now.
    public var subscriberCount: Int { subscribers.count }
    /// Subscribers dropped for not reading.
    public private(set) var droppedSubscribers = 0
    /// Admin requests answered since start-up (the control plane's share of `IdleTrim`'s activity).
    public private(set) var requestsAnswered = 0
    private let held = Atomic<Int>(0)
    /// What all event streams hold now (queued events and batches being written), in bytes. Any thread.
    public var heldBacklogBytes: Int { held.load(ordering: .relaxed) }

    public init(loop: ControlLoop, address: ListenAddress, tooLarge: AdminResponse,
                handler: @escaping (AdminRequest) -> AdminResponse) throws(EngineError) {
        guard let http = evhttp_new(loop.base) else { throw EngineError("evhttp_new failed") }
        self.http = http
        self.handler = handler
        self.tooLarge = tooLarge
        self.listenAddress = address
        // No body limit in evhttp: past it, evhttp answers with its own HTML page. `maxRequestBytes` bounds a
        // request instead, counted on each connection's bufferevent (`makeBufferevent`).
        evhttp_set_max_body_size(http, -1)
        evhttp_set_bevcb(http, adminBuffereventCallback, context(self))
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
        for intake in intakes.values {
            if let counter = intake.counter { evbuffer_remove_cb_entry(bufferevent_get_input(intake.bev), counter) }
            if let connection = connection(of: intake) { evhttp_connection_set_closecb(connection, nil, nil) }
        }
        intakes = [:]
        evhttp_free(http)
    }

    /// Sends `bytes` to every event stream whose filter takes `scope` (nil: every stream, as a heartbeat), or queues
    /// them while the stream's last batch is being written. Control loop thread only. A stream that would hold more
    /// than `subscriberBacklogLimit` is closed instead.
    public func publish(scope: String?, _ bytes: [UInt8]) {
        guard !subscribers.isEmpty else { return }
        let cost = bytes.count + Self.queuedEventOverhead
        var slow: [EventSubscriber] = []
        for subscriber in subscribers.values {
            if let scope, let filter = subscriber.scope, filter != scope { continue }
            if subscriber.inFlight == 0 {
                send([bytes], to: subscriber)
            } else if subscriber.held + cost > Self.subscriberBacklogLimit {
                slow.append(subscriber)
            } else {
                subscriber.queue.append(bytes)
                subscriber.queued += cost
                held.add(cost, ordering: .relaxed)
            }
        }
        for subscriber in slow {
            droppedSubscribers += 1
            forget(subscriber)
            forgetIntake(of: subscriber.connection)
            evhttp_connection_set_closecb(subscriber.connection, nil, nil)
            evhttp_connection_free(subscriber.connection)
        }
    }

    /// Hands `events` to evhttp as one chunk, written from one allocation of exactly their size (referenced by the
    /// evbuffer, freed by libevent once written or dropped); evhttp calls `streamWritten` when it is all in the
    /// socket's send buffer.
    private func send(_ events: [[UInt8]], to subscriber: EventSubscriber) {
        let count = events.reduce(0) { $0 + $1.count }
        guard count > 0 else { return }
        let batch = UnsafeMutableRawPointer.allocate(byteCount: count, alignment: 1)
        var offset = 0
        for event in events {
            event.withUnsafeBytes { batch.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            offset += event.count
        }
        let buffer = evbuffer_new()!
        defer { evbuffer_free(buffer) }
        guard evbuffer_add_reference(buffer, batch, count, eventBatchFreeCallback, nil) == 0 else {
            batch.deallocate()
            return
        }
        evhttp_send_reply_chunk_with_cb(subscriber.request, buffer, adminStreamWrittenCallback, context(self))
        subscriber.inFlight = count + Self.batchOverhead
        held.add(subscriber.inFlight, ordering: .relaxed)
    }

    /// A stream's last batch is all in its socket's send buffer: the events queued meanwhile go as the next one.
    func streamWritten(_ connection: OpaquePointer) {
        guard let subscriber = subscribers[connection], subscriber.inFlight > 0 else { return }
        held.subtract(subscriber.held, ordering: .relaxed)
        subscriber.inFlight = 0
        subscriber.queued = 0
        let events = subscriber.queue
        subscriber.queue = []
        send(events, to: subscriber)
    }

    /// An admin connection closed (the client left, evhttp gave up on it, or a refusal is over): its stream, if it
    /// had one, and its intake are forgotten.
    func connectionClosed(_ connection: OpaquePointer) {
        if let subscriber = subscribers[connection] { forget(subscriber) }
        forgetIntake(of: connection)
    }

    private func forget(_ subscriber: EventSubscriber) {
        subscribers.removeValue(forKey: subscriber.connection)
        held.subtract(subscriber.held, ordering: .relaxed)
        subscriber.queue = []
        subscriber.queued = 0
        subscriber.inFlight = 0
    }

    private func startStream(_ request: OpaquePointer, _ response: AdminResponse, _ stream: AdminStream) {
        guard let connection = evhttp_request_get_connection(request) else { return }
        let outputHeaders = evhttp_request_get_output_headers(request)
        for (name, value) in response.headers { evhttp_add_header(outputHeaders, name, value) }
        evhttp_send_reply_start(request, Int32(response.status), Self.reason(response.status))
        let subscriber = EventSubscriber(request: request, connection: connection, scope: stream.scope, transport: self)
        subscribers[connection] = subscriber
        evhttp_connection_set_closecb(connection, adminConnectionClosedCallback, context(self))
        // A stream is idle by design: evhttp's read and write timeouts would cut it. A dead or stalled reader
        // is found by the heartbeat and the backlog limit instead.
        evhttp_connection_set_timeout(connection, -1)
        // A small kernel send buffer too: a reader that stops shows up in the backlog after tens of KiB, not after
        // the megabytes loopback autotuning would otherwise queue in the kernel for it.
        if let bev = evhttp_connection_get_bufferevent(connection) {
            var size = Int32(Self.subscriberBacklogLimit)
            _ = setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        send([response.body], to: subscriber)
    }

    func handle(_ request: OpaquePointer) {
        guard let size = requestHandedOver(request) else { return }
        requestsAnswered += 1
        if size > Self.maxRequestBytes {
            // Whole before the intake could refuse it (it passed the limit in its last read).
            reply(request, tooLarge, method: "")
            return
        }
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
        reply(request, response, method: method)
    }

    private func reply(_ request: OpaquePointer, _ response: AdminResponse, method: String) {
        let outputHeaders = evhttp_request_get_output_headers(request)
        for (name, value) in response.headers { evhttp_add_header(outputHeaders, name, value) }
        let buffer = evbuffer_new()!
        if method != "HEAD" && !response.body.isEmpty { evbuffer_add(buffer, response.body, response.body.count) }
        evhttp_send_reply(request, Int32(response.status), Self.reason(response.status), buffer)
        evbuffer_free(buffer)
    }

    // MARK: the request size limit (`AdminIntake`)

    /// evhttp wants the bufferevent of a new connection: one that counts what it reads. evhttp makes its connection
    /// around it after this returns; `attach` finds that (from the loop, at once), holding the bufferevent meanwhile
    /// so that one evhttp drops at once stays valid until then.
    func makeBufferevent(_ base: OpaquePointer) -> OpaquePointer? {
        // Options as evhttp's own (it closes the socket itself).
        guard let bev = bufferevent_socket_new(base, -1, 0) else { return nil }
        let intake = AdminIntake(transport: self, bev: bev)
        intake.counter = evbuffer_add_cb(bufferevent_get_input(bev), adminIntakeCallback, context(intake))
        intakes[bev] = intake
        bufferevent_incref(bev)
        if event_base_once(base, -1, Int16(EV_TIMEOUT), adminIntakeAttachCallback, context(intake), nil) != 0 {
            _ = bufferevent_decref(bev)
        }
        return bev
    }

    /// evhttp's connection for `intake`, when evhttp has one around its bufferevent: the argument of the
    /// bufferevent's callbacks, which evhttp sets to its connection.
    private func connection(of intake: AdminIntake) -> OpaquePointer? {
        if let refusing = intake.refusing { return refusing }
        var argument: UnsafeMutableRawPointer?
        bufferevent_getcb(intake.bev, nil, nil, nil, &argument)
        guard let argument else { return nil }
        let connection = OpaquePointer(argument)
        return evhttp_connection_get_bufferevent(connection) == intake.bev ? connection : nil
    }

    /// Right after evhttp took `intake`'s bufferevent: its connection closing will forget the intake. A bufferevent
    /// evhttp already dropped (it clears the callbacks when it frees it) is forgotten now.
    func attach(_ intake: AdminIntake) {
        let bev = intake.bev
        if let connection = connection(of: intake) {
            evhttp_connection_set_closecb(connection, adminConnectionClosedCallback, context(self))
        } else {
            forget(intake)
        }
        _ = bufferevent_decref(bev)
    }

    /// `count` bytes were read on `intake`'s connection.
    func received(_ count: Int, on intake: AdminIntake) {
        guard intake.refusing == nil else { return }
        let before = intake.received - intake.requestStart
        intake.received += count
        if before > Self.maxRequestBytes { refuse(intake) }
    }

    /// evhttp hands `request` over whole: its size (head and body as read), and the next request starts behind it
    /// (what is left in the input). nil for a connection this transport refused (it answers nothing more there).
    private func requestHandedOver(_ request: OpaquePointer) -> Int? {
        guard let connection = evhttp_request_get_connection(request),
              let bev = evhttp_connection_get_bufferevent(connection),
              let intake = intakes[bev] else { return 0 }
        guard intake.refusing == nil else { return nil }
        let next = intake.received - evbuffer_get_length(bufferevent_get_input(bev))
        defer { intake.requestStart = next }
        return next - intake.requestStart
    }

    /// Takes the connection from evhttp and answers `tooLarge` on it, then `Connection: close`: evhttp's callbacks
    /// are replaced, what is read is dropped, and once the answer is written and the client stopped sending (or a
    /// timeout passed), evhttp frees the connection. Read on meanwhile, not closed at once: closing on unread bytes
    /// resets the connection, and the client may lose the answer (RFC 9112 §9.6).
    private func refuse(_ intake: AdminIntake) {
        guard let connection = connection(of: intake) else { return }
        intake.refusing = connection
        requestsAnswered += 1
        let bev = intake.bev
        bufferevent_setcb(bev, adminRefusalReadCallback, adminRefusalWriteCallback, adminRefusalEventCallback, context(intake))
        bufferevent_setwatermark(bev, Int16(EV_READ | EV_WRITE), 0, 0)
        var text = "HTTP/1.1 \(tooLarge.status) \(Self.reason(tooLarge.status))\r\n"
        for (name, value) in tooLarge.headers { text += "\(name): \(value)\r\n" }
        text += "Content-Length: \(tooLarge.body.count)\r\nConnection: close\r\n\r\n"
        let output = bufferevent_get_output(bev)
        let head = Array(text.utf8)
        evbuffer_add(output, head, head.count)
        evbuffer_add(output, tooLarge.body, tooLarge.body.count)
        var readTimeout = timeval(tv_sec: 5, tv_usec: 0)
        var writeTimeout = readTimeout
        bufferevent_set_timeouts(bev, &readTimeout, &writeTimeout)
        bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
    }

    /// A refused connection's bytes: dropped, up to `maxDroppedBytes`.
    func refusalReadable(_ intake: AdminIntake) {
        let input = bufferevent_get_input(intake.bev)
        let length = evbuffer_get_length(input)
        intake.dropped += length
        evbuffer_drain(input, length)
        if intake.dropped > Self.maxDroppedBytes { refusalEnded(intake) }
    }

    /// A refusal is written whole: the client hears that nothing more comes, and what it still sends is dropped
    /// until it closes.
    func refusalWritten(_ intake: AdminIntake) {
        guard !intake.refusalWritten else { return }
        intake.refusalWritten = true
        shutdown(bufferevent_getfd(intake.bev), Int32(SHUT_WR))
    }

    /// The client closed, the connection failed, or a timeout passed: the refusal is over.
    func refusalEnded(_ intake: AdminIntake) {
        guard let connection = intake.refusing else { return }
        forget(intake)
        evhttp_connection_free(connection)
    }

    private func forgetIntake(of connection: OpaquePointer) {
        guard let bev = evhttp_connection_get_bufferevent(connection), let intake = intakes[bev] else { return }
        forget(intake)
    }

    private func forget(_ intake: AdminIntake) {
        intakes.removeValue(forKey: intake.bev)
        if let counter = intake.counter { evbuffer_remove_cb_entry(bufferevent_get_input(intake.bev), counter) }
        intake.counter = nil
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
