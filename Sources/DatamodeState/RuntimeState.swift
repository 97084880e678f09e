import DatamodeConfig
import DatamodePolicy
import Synchronization

/// What every worker needs to answer a request: the configuration snapshot, the compiled policy and the
/// active data mode. Immutable; replaced whole.
public struct RuntimeSnapshot: Sendable {
    public var configuration: ProxyConfiguration
    public var policy: PolicySnapshot
    public var mode: DataMode
    public var modeSource: ModeSource
    /// Seconds since the Unix epoch when the mode last changed.
    public var modeSince: Int64
    /// The live sessions by id (SPEC §12); each worker reads its own copy of this table.
    public var sessions: [String: SessionScope] = [:]
    /// The last `SessionScope.serial` handed out.
    public var sessionSerial: UInt64 = 0
    /// The link profile set with `PUT /conditions` (SPEC §10), by name; nil when none is.
    public var apiProfile: String?
    /// The running schedules (SPEC §12) as their steps still to come, by scope (`""`: the global mode, else a
    /// session id): what a refusal's `liftsAt` reads (SPEC §18.1). Published by the control plane whenever a
    /// schedule is set, cancelled or steps.
    public var scheduleOutlooks: [String: ScheduleOutlook] = [:]

    public init(configuration: ProxyConfiguration, policy: PolicySnapshot, mode: DataMode, modeSource: ModeSource,
                modeSince: Int64, apiProfile: String? = nil) {
        self.configuration = configuration
        self.policy = policy
        self.mode = mode
        self.modeSource = modeSource
        self.modeSince = modeSince
        self.apiProfile = apiProfile
    }

    /// The lowest `SessionScope.slot` no live session holds: where a new session's counters go.
    public func freeSessionSlot() -> Int {
        var taken = [Bool](repeating: false, count: sessions.count)
        for scope in sessions.values where scope.slot < taken.count { taken[scope.slot] = true }
        return taken.firstIndex(of: false) ?? taken.count
    }

    /// The link profile in force for traffic judged by `mode` (SPEC §10), and why.
    public func profile(for mode: DataMode) -> ProfileResolution {
        ProfileResolution(api: apiProfile, mode: mode, link: configuration.link)
    }

    /// The link profile in force for traffic under the global mode.
    public var profileInForce: ProfileResolution { profile(for: mode) }

    /// The mode in force when it was set through the admin API, else `nil`.
    public var apiMode: DataMode? { modeSource == .api ? mode : nil }

    /// Puts `resolution`'s mode in force, moving `modeSince` to `now` when the resolution says it changed.
    public mutating func apply(_ resolution: ModeResolution, now: Int64) {
        modeSince = resolution.since(replacing: mode, from: modeSource, since: modeSince, now: now)
        mode = resolution.mode
        modeSource = resolution.source
    }
}

/// The one shared, mutable thing between the control plane (admin API, signals) and the workers.
///
/// Writers (rare: a mode flip, a variant registration, a reload) replace the snapshot under a mutex and bump
/// `generation`. Workers read only the atomic generation on the request path and take the mutex only when it
/// changed, so the hot path never contends on a lock (STYLE: "nothing shared on the hot path").
public final class RuntimeState: Sendable {
    private let current: Mutex<RuntimeSnapshot>
    @usableFromInline let generationCounter = Atomic<UInt64>(1)

    public init(_ snapshot: RuntimeSnapshot) {
        current = Mutex(snapshot)
    }

    /// Changes with every update; compare to a cached value to know whether to refresh.
    @inlinable public var generation: UInt64 { generationCounter.load(ordering: .acquiring) }

    /// The current snapshot and its generation.
    public func load() -> (generation: UInt64, snapshot: RuntimeSnapshot) {
        current.withLock { snapshot in (generationCounter.load(ordering: .acquiring), snapshot) }
    }

    /// Replaces the snapshot through `change` and publishes it. Returns what `change` returns.
    @discardableResult
    public func update<R>(_ change: (inout RuntimeSnapshot) throws -> R) rethrows -> R {
        try current.withLock { snapshot in
            let result = try change(&snapshot)
            generationCounter.add(1, ordering: .releasing)
            return result
        }
    }
}
