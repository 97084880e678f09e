import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import Dispatch
import Logging

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
/// so nothing an operator set is lost with Redis's memory. Budget counters are raised to at least what each proxy
/// knew every time it connects (`FleetBudgets.raiseCommands`).
final class FleetStore: SharedStateWriter, @unchecked Sendable {
    let link: RedisLink
    let prefix: String
    private let logger: Logger
    /// How long an admin write waits for Redis before answering 503.
    static let writeDeadline: DispatchTimeInterval = .seconds(1)
    /// What the proxy knew last, by followed file name (the local files): what an empty Redis is seeded with.
    private let lastKnown: @Sendable (String) -> [UInt8]?
    /// Hands a value read from Redis to the control plane: (file name, bytes or nil, key).
    private let deliver: @Sendable (String, [UInt8]?, String) -> Void

    static let names = ["mode.json", "conditions.json", "variants.json"]

    /// Commands sent each time the link comes up, before the state is read (the budgets' counters raised to at
    /// least what this proxy knew). Set before `start()`.
    var onUpCommands: (@Sendable () -> [[[UInt8]]])?

    init(settings: RedisStoreSettings, password: String?, logger: Logger,
         lastKnown: @escaping @Sendable (String) -> [UInt8]?,
         deliver: @escaping @Sendable (String, [UInt8]?, String) -> Void) throws(EngineError) {
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

    // MARK: writes (the control plane, one at a time)

    func share(_ name: String, _ value: [UInt8]?) throws(StateStore.StateError) {
        guard link.isUp else {
            throw StateStore.StateError(description: "the shared store (Redis) is unreachable; nothing was changed", unavailable: true)
        }
        let write: [[UInt8]] = value.map { [Array("SET".utf8), Array(key(name).utf8), $0] } ?? [Array("DEL".utf8), Array(key(name).utf8)]
        let publish = [Array("PUBLISH".utf8), Array((prefix + "changes").utf8), Array(name.utf8)]
        let done = DispatchSemaphore(value: 0)
        let answer = ReplyBox()
        link.pipeline([write, publish]) { replies in
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
        guard Self.names.contains(name) else { return }
        read([name])
    }

    /// Reads all followed keys: every second, and when the link comes up.
    func sync() {
        guard link.isUp else { return }
        read(Self.names)
    }

    private func read(_ names: [String]) {
        let keys = names.map(key)
        link.pipeline(keys.map { [Array("GET".utf8), Array($0.utf8)] }) { [deliver] replies in
            for (index, reply) in replies.enumerated() {
                switch reply {
                case .string(let bytes)?: deliver(names[index], bytes, keys[index])
                case .null?: deliver(names[index], nil, keys[index])
                default: continue
                }
            }
        }
    }

    /// Up (again): an empty Redis is seeded with what this proxy knew last, then everything is read.
    private func cameUp() {
        if let commands = onUpCommands?(), !commands.isEmpty { link.pipeline(commands) { _ in } }
        link.command([Array("EXISTS".utf8), Array(seededKey.utf8)]) { [self] reply in
            guard reply == .integer(0) else { return sync() }
            var batch: [[[UInt8]]] = []
            for name in Self.names {
                guard let bytes = lastKnown(name) else { continue }
                batch.append([Array("SET".utf8), Array(key(name).utf8), bytes, Array("NX".utf8)])
            }
            batch.append([Array("SET".utf8), Array(seededKey.utf8), Array("1".utf8)])
            logger.info("store: Redis holds no state for this prefix; seeding it with the state this proxy knew",
                        metadata: ["prefix": "\(prefix)", "commands": "\(batch.count - 1)"])
            link.pipeline(batch) { [self] _ in sync() }
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
