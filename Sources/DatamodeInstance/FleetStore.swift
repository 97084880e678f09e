import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import Dispatch
import Logging
import Synchronization

/// The state many proxies share in Redis (SPEC §19 `store.kind: redis`): the global mode, the API variants and the
/// link profile, one key each (`<prefix>state:mode`, `…:variants`, `…:conditions`, holding the same JSON as the
/// state directory's files), and a channel (`<prefix>changes`) on which a proxy that changed one names it.
///
/// Writes (the admin API's) go to Redis first, with a deadline: a Redis that cannot take them makes the admin
/// write fail with `503 store-unavailable` and nothing changes on any proxy. Reads come three ways, all applied by
/// the admin API on the control loop (`AdminAPI.applyShared`): a message on the channel (the change, in
/// milliseconds), every second a read of all three keys (what a lost message or a write made with redis-cli
/// would otherwise miss), and a read when the link comes up. A Redis that comes up without `<prefix>seeded` is
/// new or came back empty: the proxy seeds it with the state it last knew (`SET … NX`: the first proxy's wins),
/// so nothing an operator set is lost with Redis's memory. Every field of the budgets' hashes is raised to at least what
/// each proxy saw in it every time it connects (`FleetBudgets.raiseCommands`).
///
/// Sessions (SPEC §12) are one key each, `<prefix>session:<id>` (`SharedSession`'s JSON), expiring after
/// `sessions.idle-expiry` unless a proxy that saw the session used refreshes it (`refreshSessions`, once per expiry
/// tick, never per request), listed in the set `<prefix>sessions`. Schedules are the fields of the hash
/// `<prefix>state:schedules` (`global` or the session id; `SharedSchedule`'s JSON with its wall-clock start): each
/// proxy runs them itself, and a step's mode is never written back. A change is named on the channel as
/// `session:<id>` or `schedule`. A read sent before this proxy's latest write is stale (its `generation` is older)
/// and dropped by the caller; the write's own message brings the fresh one.
final class FleetStore: SharedStateWriter, @unchecked Sendable {
    let link: RedisLink
    let prefix: String
    private let logger: Logger
    /// How long an admin write waits for Redis before answering 503.
    static let writeDeadline: DispatchTimeInterval = .seconds(1)
    /// What the proxy knew last, by followed file name (the local files): what an empty Redis is seeded with.
    private let lastKnown: @Sendable (String) -> [UInt8]?
    /// Hands a value read from Redis to the control plane: (file name, bytes or nil, key, whether a change of it
    /// was announced on the channel: then it is applied even if this proxy read the same bytes before).
    private let deliver: @Sendable (String, [UInt8]?, String, Bool) -> Void

    static let names = ["mode.json", "conditions.json", "variants.json"]

    /// Commands sent each time the link comes up, before the state is read (the budgets' hashes raised to at
    /// least what this proxy saw in them). Set before `start()`.
    var onUpCommands: (@Sendable () -> [[[UInt8]]])?

    /// Sessions read: (the sessions, whether they are all the store holds, the write generation the read was sent
    /// at). Set before `start()`; called on the link's thread.
    var deliverSessions: (@Sendable ([SharedSessionRead], Bool, UInt64) -> Void)?
    /// The schedules' hash read, by field, with the write generation it was sent at.
    var deliverSchedules: (@Sendable ([String: [UInt8]], UInt64) -> Void)?
    /// What an empty Redis is seeded with besides the files: the sessions and schedules this proxy holds, and how
    /// long a session lives unused.
    var seedScopes: (@Sendable () -> (sessions: [String: [UInt8]], schedules: [String: [UInt8]], lifetime: Duration))?

    /// Grows with every write this proxy sends (before it is sent).
    private let writes = Atomic<UInt64>(0)
    var writeGeneration: UInt64 { writes.load(ordering: .acquiring) }

    init(settings: RedisStoreSettings, password: String?, logger: Logger,
         lastKnown: @escaping @Sendable (String) -> [UInt8]?,
         deliver: @escaping @Sendable (String, [UInt8]?, String, Bool) -> Void) throws(EngineError) {
        prefix = settings.keyPrefix
        self.logger = logger
        self.lastKnown = lastKnown
        self.deliver = deliver
        let endpoint = RedisEndpoint(host: settings.host, port: settings.port, database: settings.database, password: password)
        let holder = LinkHolder()
        link = try RedisLink(endpoint: endpoint, channel: settings.keyPrefix + "changes", logger: logger) { payload in
            holder.store?.changed(String(decoding: payload, as: UTF8.self))
        }
        holder.store = self
        link.onUp = { [unowned self] in self.cameUp() }
    }

    func start() { link.start() }
    func stop() { link.stop() }

    var isUp: Bool { link.isUp }

    func key(_ name: String) -> String {
        prefix + "state:" + (name.hasSuffix(".json") ? String(name.dropLast(5)) : name)
    }

    var seededKey: String { prefix + "seeded" }
    var sessionsKey: String { prefix + "sessions" }
    func sessionKey(_ id: String) -> String { prefix + "session:" + id }
    var schedulesKey: String { prefix + "state:schedules" }
    private var channel: [UInt8] { Array((prefix + "changes").utf8) }

    private static func command(_ words: String...) -> [[UInt8]] { words.map { Array($0.utf8) } }

    // MARK: writes (the control plane, one at a time)

    func share(_ name: String, _ value: [UInt8]?) throws(StateStore.StateError) {
        let write: [[UInt8]] = value.map { [Array("SET".utf8), Array(key(name).utf8), $0] } ?? [Array("DEL".utf8), Array(key(name).utf8)]
        var batch = [write, [Array("PUBLISH".utf8), channel, Array(name.utf8)]]
        if name == "mode.json" {
            // SPEC §12: `PUT` or `DELETE /mode` cancels the global schedule, on every proxy.
            batch += [Self.command("HDEL", schedulesKey, SharedSchedule.globalField), Self.command("PUBLISH", prefix + "changes", "schedule")]
        }
        try send(batch)
    }

    func shareSession(_ id: String, _ value: [UInt8]?, lifetime: Duration) throws(StateStore.StateError) {
        var batch: [[[UInt8]]]
        if let value {
            batch = [[Array("SET".utf8), Array(sessionKey(id).utf8), value, Array("PX".utf8), Array(String(max(1, lifetime.milliseconds)).utf8)],
                     Self.command("SADD", sessionsKey, id)]
        } else {
            batch = [Self.command("DEL", sessionKey(id)), Self.command("SREM", sessionsKey, id)]
        }
        // Setting or deleting a session cancels its schedule (SPEC §12).
        batch += [Self.command("HDEL", schedulesKey, id), Self.command("PUBLISH", prefix + "changes", "session:" + id),
                  Self.command("PUBLISH", prefix + "changes", "schedule")]
        try send(batch)
    }

    func shareSchedule(_ scope: String, _ value: [UInt8]?) throws(StateStore.StateError) {
        let write: [[UInt8]] = value.map { [Array("HSET".utf8), Array(schedulesKey.utf8), Array(scope.utf8), $0] }
            ?? Self.command("HDEL", schedulesKey, scope)
        try send([write, Self.command("PUBLISH", prefix + "changes", "schedule")])
    }

    func refreshSessions(_ ids: [String], lifetime: Duration) {
        guard link.isUp, !ids.isEmpty else { return }
        let milliseconds = String(max(1, lifetime.milliseconds))
        link.pipeline(ids.map { Self.command("PEXPIRE", sessionKey($0), milliseconds) }) { _ in }
    }

    /// Sends a write and waits for every reply, up to `writeDeadline`: a refusal, a lost link or no answer in time
    /// throw `unavailable` (the admin write answers 503 and changes nothing here).
    private func send(_ batch: [[[UInt8]]]) throws(StateStore.StateError) {
        guard link.isUp else {
            throw StateStore.StateError(description: "the shared store (Redis) is unreachable; nothing was changed", unavailable: true)
        }
        writes.add(1, ordering: .releasing)
        let done = DispatchSemaphore(value: 0)
        let answer = ReplyBox()
        link.pipeline(batch) { replies in
            answer.replies = replies
            done.signal()
        }
        guard done.wait(timeout: .now() + Self.writeDeadline) == .success else {
            throw StateStore.StateError(description: "the shared store (Redis) did not answer within 1 s; nothing was changed", unavailable: true)
        }
        for reply in answer.replies {
            switch reply {
            case nil:
                throw StateStore.StateError(description: "the connection to the shared store (Redis) was lost; nothing was changed", unavailable: true)
            case .error(let text)?:
                throw StateStore.StateError(description: "the shared store (Redis) refused the write: \(text)", unavailable: true)
            default: continue
            }
        }
    }

    // MARK: reads (the link's thread)

    /// A proxy named a changed file on the channel: read it now.
    private func changed(_ name: String) {
        if Self.names.contains(name) {
            read([name], announced: true)
        } else if name == "schedule" {
            readSchedules()
        } else if name.hasPrefix("session:") {
            readSession(String(name.dropFirst("session:".count)))
        }
    }

    /// Every second: reads all followed keys, the sessions and the schedules, after seeding a Redis that holds no
    /// state for this prefix any more (emptied while this proxy stayed connected: `FLUSHALL`).
    func sync() {
        guard link.isUp else { return }
        seedIfEmpty(raisingBudgets: true)
    }

    private func readAll() {
        read(Self.names, announced: false)
        readSessions()
        readSchedules()
    }

    /// Every session: its value and lifetime left. Ids whose key is gone (expired) leave the set, and their
    /// schedules the hash, atomically, so that a session created meanwhile is never dropped from the set.
    static let listSessionsScript = """
        local out = {}
        for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
          local key = ARGV[1] .. id
          local kind = redis.call('TYPE', key).ok
          if kind == 'none' then
            redis.call('SREM', KEYS[1], id)
            redis.call('HDEL', KEYS[2], id)
          else
            local value = ''
            if kind == 'string' then value = redis.call('GET', key) end
            table.insert(out, id)
            table.insert(out, value)
            table.insert(out, redis.call('PTTL', key))
          end
        end
        return out
        """

    private func readSessions() {
        guard let deliver = deliverSessions else { return }
        let generation = writeGeneration
        link.command([Array("EVAL".utf8), Array(Self.listSessionsScript.utf8), Array("2".utf8), Array(sessionsKey.utf8),
                      Array(schedulesKey.utf8), Array((prefix + "session:").utf8)]) { [logger, sessionsKey] reply in
            guard case .array(let items)? = reply else {
                if case .error(let text)? = reply {
                    logger.error("store: cannot list the sessions", metadata: ["key": "\(sessionsKey)", "error": "\(text)"])
                }
                return
            }
            var reads: [SharedSessionRead] = []
            var index = 0
            while index + 2 < items.count {
                if let id = items[index].bytes {
                    let lifetime: Int64? = if case .integer(let ms) = items[index + 2] { ms } else { nil }
                    reads.append(SharedSessionRead(id: String(decoding: id, as: UTF8.self), value: items[index + 1].bytes ?? [],
                                                   lifetimeMilliseconds: lifetime))
                }
                index += 3
            }
            deliver(reads, true, generation)
        }
    }

    private func readSession(_ id: String) {
        guard let deliver = deliverSessions else { return }
        let generation = writeGeneration
        link.pipeline([Self.command("GET", sessionKey(id)), Self.command("PTTL", sessionKey(id))]) { replies in
            let value: [UInt8]?
            switch replies.first ?? nil {
            case .string(let bytes)?: value = bytes
            case .null?: value = nil
            case .error?: value = []  // not a string: refused as not JSON, naming the key
            default: return
            }
            let lifetime: Int64? = if replies.count > 1, case .integer(let ms)? = replies[1] { ms } else { nil }
            deliver([SharedSessionRead(id: id, value: value, lifetimeMilliseconds: lifetime)], false, generation)
        }
    }

    private func readSchedules() {
        guard let deliver = deliverSchedules else { return }
        let generation = writeGeneration
        link.command(Self.command("HGETALL", schedulesKey)) { [logger, schedulesKey] reply in
            guard case .array(let items)? = reply else {
                if case .error(let text)? = reply {
                    logger.error("store: cannot read the schedules", metadata: ["key": "\(schedulesKey)", "error": "\(text)"])
                }
                return
            }
            var fields: [String: [UInt8]] = [:]
            var index = 0
            while index + 1 < items.count {
                if let field = items[index].bytes, let value = items[index + 1].bytes {
                    fields[String(decoding: field, as: UTF8.self)] = value
                }
                index += 2
            }
            deliver(fields, generation)
        }
    }

    private func read(_ names: [String], announced: Bool) {
        let keys = names.map(key)
        link.pipeline(keys.map { [Array("GET".utf8), Array($0.utf8)] }) { [deliver] replies in
            for (index, reply) in replies.enumerated() {
                switch reply {
                case .string(let bytes)?: deliver(names[index], bytes, keys[index], announced)
                case .null?: deliver(names[index], nil, keys[index], announced)
                default: continue
                }
            }
        }
    }

    /// Up (again): an empty Redis is seeded with what this proxy knew last, then everything is read.
    private func cameUp() {
        if let commands = onUpCommands?(), !commands.isEmpty { link.pipeline(commands) { _ in } }
        seedIfEmpty(raisingBudgets: false)
    }

    /// Seeds Redis when it holds no `<prefix>seeded` (new, or came back empty), with the budgets' counters raised
    /// first unless they just were, then reads everything.
    private func seedIfEmpty(raisingBudgets: Bool) {
        link.command([Array("EXISTS".utf8), Array(seededKey.utf8)]) { [self] reply in
            guard reply == .integer(0) else { return readAll() }
            var batch: [[[UInt8]]] = raisingBudgets ? onUpCommands?() ?? [] : []
            for name in Self.names {
                guard let bytes = lastKnown(name) else { continue }
                batch.append([Array("SET".utf8), Array(key(name).utf8), bytes, Array("NX".utf8)])
            }
            if let scopes = seedScopes?() {
                let milliseconds = String(max(1, scopes.lifetime.milliseconds))
                for (id, value) in scopes.sessions.sorted(by: { $0.key < $1.key }) {
                    batch.append([Array("SET".utf8), Array(sessionKey(id).utf8), value, Array("PX".utf8), Array(milliseconds.utf8),
                                  Array("NX".utf8)])
                    batch.append(Self.command("SADD", sessionsKey, id))
                }
                for (field, value) in scopes.schedules.sorted(by: { $0.key < $1.key }) {
                    batch.append([Array("HSETNX".utf8), Array(schedulesKey.utf8), Array(field.utf8), value])
                }
            }
            batch.append([Array("SET".utf8), Array(seededKey.utf8), Array("1".utf8)])
            logger.info("store: Redis holds no state for this prefix; seeding it with the state this proxy knew",
                        metadata: ["prefix": "\(prefix)", "commands": "\(batch.count - 1)"])
            link.pipeline(batch) { [self] _ in readAll() }
        }
    }
}

/// Breaks the init-order knot: the link's message handler needs the store, which needs the link.
private final class LinkHolder: @unchecked Sendable {
    weak var store: FleetStore?
}

private final class ReplyBox: @unchecked Sendable {
    var replies: [RedisReply?] = []
}
