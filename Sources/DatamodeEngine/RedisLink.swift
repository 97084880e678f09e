import CHiredis
import CLibevent
import CDatamodeShims
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A Redis reply, copied out of hiredis's reply object (which is freed when the callback returns).
public enum RedisReply: Sendable, Equatable {
    case string([UInt8])
    case integer(Int64)
    case array([RedisReply])
    case null
    case status(String)
    case error(String)

    /// The bytes of a bulk or status string.
    public var bytes: [UInt8]? {
        switch self {
        case .string(let bytes): bytes
        case .status(let text): Array(text.utf8)
        default: nil
        }
    }
}

/// Where the shared store is (SPEC §19 `store.redis`): host, port, database, and the password read from its file.
public struct RedisEndpoint: Sendable, Equatable {
    public var host: String
    public var port: Int
    public var database: Int
    public var password: String?
    public init(host: String, port: Int, database: Int = 0, password: String? = nil) {
        self.host = host
        self.port = port
        self.database = database
        self.password = password
    }
}

/// The proxy's connection to Redis (SPEC §19): hiredis's asynchronous client on a libevent base of its own, on a
/// thread of its own, so that no worker and no admin request ever waits on Redis's socket.
///
/// Two connections: one for commands, one subscribed to the change channel (a subscribed connection takes no other
/// command). Each sends `AUTH` (when a password is set) and the command one `SELECT`s the database before it counts
/// as up; a lost or refused connection is tried again after 100 ms, doubling up to 2 s. A command that got no reply
/// within `replyTimeout` drops the connection (a Redis that stopped answering is down, not slow forever): its
/// callbacks complete with nil and the link reconnects.
///
/// `command` and `stop` may be called from any thread; completions, `onUp` and the subscription's handler run on the
/// link's thread and must not block.
public final class RedisLink: @unchecked Sendable {
    public let endpoint: RedisEndpoint
    let base: OpaquePointer
    private let logger: Logger
    private let up = Atomic<Bool>(false)
    private var thread: pthread_t?
    fileprivate let commands: RedisConnection
    fileprivate let subscriber: RedisConnection
    /// How long a command may wait for its reply before the connection is dropped.
    public let replyTimeout: Duration
    /// Called on the link's thread each time both connections are (again) ready: the caller resynchronises.
    public var onUp: (@Sendable () -> Void)?
    /// Called on the link's thread each time the link goes down.
    public var onDown: (@Sendable () -> Void)?
    private var watchdog: OpaquePointer?

    /// Prepares the link; nothing connects until `start()`. `channel`: what the subscriber connection listens to,
    /// `onMessage` gets each message's payload.
    public init(endpoint: RedisEndpoint, channel: String, logger: Logger, replyTimeout: Duration = .seconds(1),
                onMessage: @escaping @Sendable ([UInt8]) -> Void) throws(EngineError) {
        _ = ProxyServerProcess.setUp
        guard let base = event_base_new() else { throw EngineError("event_base_new failed") }
        self.base = base
        self.endpoint = endpoint
        self.logger = logger
        self.replyTimeout = replyTimeout
        commands = RedisConnection(role: "commands", channel: nil, onMessage: nil)
        subscriber = RedisConnection(role: "subscriber", channel: channel, onMessage: onMessage)
        commands.link = self
        subscriber.link = self
    }

    deinit {
        if let watchdog { event_free(watchdog) }
        event_base_free(base)
    }

    /// Whether both connections are ready now. Any thread; lock-free.
    public var isUp: Bool { up.load(ordering: .acquiring) }

    /// Starts the link's thread and the first connection attempts.
    public func start() {
        watchdog = event_new(base, -1, Int16(EV_PERSIST), redisWatchdogCallback, context(self))
        dm_event_add_ms(watchdog, 100)
        post { [self] in
            commands.connect()
            subscriber.connect()
        }
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        var created = pthread_t()
        let box = Unmanaged.passRetained(self).toOpaque()
        pthread_create(&created, &attributes, { argument in
            let link = Unmanaged<RedisLink>.fromOpaque(argument!).takeRetainedValue()
            event_base_loop(link.base, 0x04 /* EVLOOP_NO_EXIT_ON_EMPTY */)
            return nil
        }, box)
        pthread_attr_destroy(&attributes)
        thread = created
    }

    /// Closes both connections and ends the thread. Any thread but the link's.
    public func stop() {
        post { [self] in
            commands.close()
            subscriber.close()
            event_base_loopexit(base, nil)
        }
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    /// Sends `arguments` (binary-safe) on the command connection; `completion` gets the reply, or nil when the link
    /// is down or goes down before the reply. Any thread.
    public func command(_ arguments: [[UInt8]], completion: @escaping @Sendable (RedisReply?) -> Void) {
        post { [self] in commands.send(arguments, completion: completion) }
    }

    /// Several commands in order, one completion with every reply (nil entries: not answered).
    public func pipeline(_ batch: [[[UInt8]]], completion: @escaping @Sendable ([RedisReply?]) -> Void) {
        post { [self] in
            guard !batch.isEmpty else { return completion([]) }
            let replies = RepliesBox(count: batch.count)
            for (index, arguments) in batch.enumerated() {
                commands.send(arguments) { reply in
                    replies.values[index] = reply
                    replies.remaining -= 1
                    if replies.remaining == 0 { completion(replies.values) }
                }
            }
        }
    }

    /// Runs `work` on the link's thread.
    func post(_ work: @escaping () -> Void) {
        let box = Unmanaged.passRetained(ControlPost(work)).toOpaque()
        if event_base_once(base, -1, Int16(EV_TIMEOUT), controlPostCallback, box, nil) != 0 {
            Unmanaged<ControlPost>.fromOpaque(box).release()
        }
    }

    fileprivate func connectionChanged() {
        let ready = commands.ready && subscriber.ready
        guard up.exchange(ready, ordering: .acquiringAndReleasing) != ready else { return }
        if ready {
            logger.info("store: connected to Redis", metadata: ["host": "\(endpoint.host)", "port": "\(endpoint.port)"])
            onUp?()
        } else {
            logger.warning("store: Redis is unreachable; going on with the last state known, counting locally",
                           metadata: ["host": "\(endpoint.host)", "port": "\(endpoint.port)"])
            onDown?()
        }
    }

    fileprivate func log(_ message: Logger.Message, _ role: String, _ detail: String) {
        logger.warning(message, metadata: ["connection": "\(role)", "error": "\(detail)"])
    }

    /// Every 100 ms: a connection whose oldest command waited longer than `replyTimeout` is dropped.
    func watch() {
        let limit = UInt64(replyTimeout.components.seconds) * 1_000_000_000 + UInt64(replyTimeout.components.attoseconds / 1_000_000_000)
        let now = Self.monotonic()
        commands.dropIfStalled(now: now, limit: limit)
        subscriber.dropIfStalled(now: now, limit: limit)
    }

    static func monotonic() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}

/// Replies of a pipeline, gathered on the link's thread.
private final class RepliesBox: @unchecked Sendable {
    var values: [RedisReply?]
    var remaining: Int
    init(count: Int) {
        values = Array(repeating: nil, count: count)
        remaining = count
    }
}

/// A command's completion, carried through hiredis as its private data.
final class RedisCompletion {
    let completion: (RedisReply?) -> Void
    init(_ completion: @escaping (RedisReply?) -> Void) { self.completion = completion }
}

/// One hiredis asynchronous connection of a `RedisLink`, with its reconnection. Link thread only.
final class RedisConnection {
    let role: String
    let channel: String?
    let onMessage: (@Sendable ([UInt8]) -> Void)?
    weak var link: RedisLink?
    private var handle: UnsafeMutablePointer<redisAsyncContext>?
    /// Both connected and through its handshake (AUTH, SELECT or SUBSCRIBE).
    private(set) var ready = false
    private var backoffMilliseconds: Int64 = 100
    private var retry: OpaquePointer?
    /// When each command still waiting for its reply was sent (oldest first).
    private var pending: [UInt64] = []
    private var closing = false

    init(role: String, channel: String?, onMessage: (@Sendable ([UInt8]) -> Void)?) {
        self.role = role
        self.channel = channel
        self.onMessage = onMessage
    }

    deinit { if let retry { event_free(retry) } }

    func connect() {
        guard let link, handle == nil, !closing else { return }
        guard let created = redisAsyncConnect(link.endpoint.host, Int32(link.endpoint.port)) else { return scheduleRetry() }
        if created.pointee.err != 0 {
            link.log("store: cannot connect to Redis", role, String(cString: created.pointee.errstr))
            redisAsyncFree(created)
            return scheduleRetry()
        }
        created.pointee.data = DatamodeEngine.context(self)
        _ = chiredis_libevent_attach(created, link.base)
        redisAsyncSetConnectCallback(created, redisConnectCallback)
        redisAsyncSetDisconnectCallback(created, redisDisconnectCallback)
        handle = created
        pending.removeAll()
        // The handshake is queued now and sent once connected; replies come in order.
        if let password = link.endpoint.password {
            send([Array("AUTH".utf8), Array(password.utf8)]) { [weak self] reply in self?.handshake(reply, step: "AUTH") }
        }
        if let channel {
            rawSend([Array("SUBSCRIBE".utf8), Array(channel.utf8)], privateData: DatamodeEngine.context(self), callback: redisMessageCallback)
        } else {
            send([Array("SELECT".utf8), Array(String(link.endpoint.database).utf8)]) { [weak self] reply in
                self?.handshake(reply, step: "SELECT")
                if case .status = reply { self?.becameReady() }
            }
        }
    }

    private func handshake(_ reply: RedisReply?, step: String) {
        guard case .error(let text) = reply else { return }
        // A wrong password or database is a configuration error: said each attempt, never with the password.
        link?.log("store: Redis refused \(step)", role, text)
        // Inside hiredis's callback: ask it to close once the replies queued are in (freeing here would be a
        // use after free); the disconnect callback then reconnects after the backoff.
        if let handle { redisAsyncDisconnect(handle) }
    }

    private func becameReady() {
        ready = true
        backoffMilliseconds = 100
        link?.connectionChanged()
    }

    /// A subscription reply: the confirmation makes the subscriber ready, a message goes to the handler.
    func message(_ reply: RedisReply?) {
        guard case .array(let parts) = reply, parts.count == 3, let kind = parts[0].bytes else { return }
        if kind == Array("subscribe".utf8) {
            if !pending.isEmpty { pending.removeFirst() }
            becameReady()
        } else if kind == Array("message".utf8), let payload = parts[2].bytes {
            onMessage?(payload)
        }
    }

    func send(_ arguments: [[UInt8]], completion: @escaping (RedisReply?) -> Void) {
        guard handle != nil else { return completion(nil) }
        let box = Unmanaged.passRetained(RedisCompletion(completion)).toOpaque()
        if !rawSend(arguments, privateData: box, callback: redisReplyCallback) {
            Unmanaged<RedisCompletion>.fromOpaque(box).release()
            completion(nil)
        }
    }

    /// Queues a command; false when hiredis refused it (the connection is closing).
    @discardableResult
    private func rawSend(_ arguments: [[UInt8]], privateData: UnsafeMutableRawPointer,
                         callback: @escaping @convention(c) (UnsafeMutablePointer<redisAsyncContext>?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void) -> Bool {
        guard let handle else { return false }
        let pointers = arguments.map { bytes -> UnsafeMutablePointer<CChar> in
            let copy = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, bytes.count))
            bytes.withUnsafeBytes { raw in
                if let base = raw.baseAddress { UnsafeMutableRawPointer(copy).copyMemory(from: base, byteCount: bytes.count) }
            }
            return copy
        }
        defer { pointers.forEach { $0.deallocate() } }
        var argv: [UnsafePointer<CChar>?] = pointers.map { UnsafePointer($0) }
        var lengths = arguments.map { $0.count }
        let status = redisAsyncCommandArgv(handle, callback, privateData, Int32(arguments.count), &argv, &lengths)
        if status == REDIS_OK { pending.append(RedisLink.monotonic()) }
        return status == REDIS_OK
    }

    /// A reply arrived for the oldest command (replies come in order).
    func replied() {
        if !pending.isEmpty { pending.removeFirst() }
    }

    func connected(status: Int32) {
        guard status != REDIS_OK else { return }
        // hiredis frees the handle after this callback.
        let reason = handle.map { String(cString: $0.pointee.errstr) } ?? "connect failed"
        link?.log("store: cannot connect to Redis", role, reason)
        lost()
    }

    func disconnected(status: Int32) {
        if status != REDIS_OK, let handle {
            link?.log("store: connection to Redis lost", role, String(cString: handle.pointee.errstr))
        }
        lost()
    }

    /// The handle is gone (hiredis frees it after the callback that got here, or `drop` freed it). Once per handle.
    private func lost() {
        guard handle != nil else { return }
        handle = nil
        pending.removeAll()
        if ready {
            ready = false
            if !closing { link?.connectionChanged() }
        }
        scheduleRetry()
    }

    private func scheduleRetry() {
        guard let link, !closing else { return }
        if retry == nil { retry = dm_timer_new(link.base, redisRetryCallback, DatamodeEngine.context(self)) }
        dm_event_add_ms(retry, backoffMilliseconds)
        backoffMilliseconds = min(2000, backoffMilliseconds * 2)
    }

    /// Drops the connection now (never from inside a hiredis callback): every pending callback completes with nil,
    /// then the connection is tried again after the backoff.
    func drop() {
        guard let current = handle else { return }
        // Frees at once, calling pending callbacks with nil and the disconnect callback (which calls `lost`) when
        // the connection was up; `lost` below covers a connection still being made.
        redisAsyncFree(current)
        lost()
    }

    func dropIfStalled(now: UInt64, limit: UInt64) {
        guard let oldest = pending.first, now &- oldest > limit else { return }
        link?.log("store: Redis did not answer in time; reconnecting", role, "no reply within \(limit / 1_000_000) ms")
        drop()
    }

    func close() {
        closing = true
        if let retry { event_del(retry) }
        guard let current = handle else { return }
        redisAsyncFree(current)
        handle = nil
        ready = false
    }
}

extension RedisReply {
    /// Copies hiredis's reply (nil: the command was dropped unanswered).
    init?(_ pointer: UnsafeMutableRawPointer?) {
        guard let pointer else { return nil }
        let reply = pointer.assumingMemoryBound(to: redisReply.self).pointee
        func bytes() -> [UInt8] {
            guard let text = reply.str, reply.len > 0 else { return [] }
            return Array(UnsafeRawBufferPointer(start: text, count: Int(reply.len)))
        }
        switch reply.type {
        case REDIS_REPLY_STRING: self = .string(bytes())
        case REDIS_REPLY_INTEGER: self = .integer(Int64(reply.integer))
        case REDIS_REPLY_NIL: self = .null
        case REDIS_REPLY_STATUS: self = .status(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ERROR: self = .error(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ARRAY:
            var elements: [RedisReply] = []
            for index in 0..<Int(reply.elements) {
                elements.append(RedisReply(UnsafeMutableRawPointer(reply.element[index])) ?? .null)
            }
            self = .array(elements)
        default: self = .null
        }
    }
}
