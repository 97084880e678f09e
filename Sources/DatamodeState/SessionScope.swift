import DatamodePolicy

/// A session as the workers see it (SPEC §12): a named scope whose mode replaces the global one for the requests
/// that belong to it. Part of the `RuntimeSnapshot`, so a worker looks a session up in its own copy of the table
/// (one hash lookup, no lock) and a change reaches it like any mode flip, at its next request head.
public struct SessionScope: Sendable, Equatable {
    public var mode: DataMode
    /// The link profile named for the session, validated when set; the shaping of SPEC §10 reads it from here.
    public var profile: String?
    /// `api` (set by `PUT /sessions/{id}`) or `schedule`.
    public var modeSource: ModeSource
    /// Seconds since the Unix epoch when the session's mode last changed.
    public var since: Int64
    /// Differs between two sessions of the same id (one deleted, the other created): the workers start the
    /// newer one's counters from zero. Grows with every session created.
    public var serial: UInt64
    /// The session id interned: where each worker keeps the session's counters (the lowest slot no live session
    /// holds when it was created), so counting a request indexes an array instead of hashing the id again.
    public var slot: Int

    public init(mode: DataMode, profile: String?, modeSource: ModeSource, since: Int64, serial: UInt64, slot: Int) {
        self.mode = mode
        self.profile = profile
        self.modeSource = modeSource
        self.since = since
        self.serial = serial
        self.slot = slot
    }
}
