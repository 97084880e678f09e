import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodePolicy
import DatamodeState

/// The latency a link profile adds to one exchange (SPEC §10): once, before the response head is relayed (or a
/// tunnel's first byte from the origin), counted from the moment those bytes arrive, as a link's delay would.
enum AddedLatency {
    /// Nothing (left) to add.
    case none
    /// To add once the origin's first bytes arrive: this many microseconds.
    case pending(microseconds: Int64)
    /// The origin's first bytes are held until this monotonic time (nanoseconds).
    case holding(until: UInt64)
}

/// Link shaping on a client connection (SPEC §10): the pumps ask here how many bytes may move now.
///
/// Shaping never buffers: a pump that may not move bytes leaves them where they are (the source's input buffer),
/// whose read watermark then stops reading from that socket, exactly as a slow peer would. While a bucket is what
/// holds bytes back, one timer per connection wakes it when a quantum may pass; an idle shaped connection has no
/// timer at all. Shaped exchanges are never handed to splice(2), which would move bytes past the buckets.
extension ExchangeDriver {
    /// The link profile in force for a request judged by `mode` (SPEC §10): its session's, else the one set through
    /// the admin API, else `mode`'s mapping (resolved once per snapshot for the global mode).
    func linkProfile(mode: DataMode) -> LinkProfile? {
        let settings = worker.settings
        if let name = exchange.session?.profile, let profile = settings.link.profiles[name] { return profile }
        return mode == settings.mode ? settings.profile : settings.profile(for: mode)
    }

    /// Puts the link profile in force (if any) on `exchange`: its buckets and its added latency.
    func applyLinkProfile(_ profile: LinkProfile?) {
        guard let profile else { return }
        link = worker.linkBuckets(profile, client: client.peerAddress)
        var microseconds = profile.latencyMicroseconds
        let jitter = profile.jitterMicroseconds
        if jitter > 0 { microseconds = max(0, microseconds + Int64.random(in: -jitter...jitter)) }
        if microseconds > 0 { latency = .pending(microseconds: microseconds) }
    }

    /// Whether the origin's first bytes may be relayed now. `arrived`: some are buffered. The first time bytes
    /// are there, the hold starts; the shaping timer ends it.
    func latencyElapsed(arrived: Bool) -> Bool {
        switch latency {
        case .none:
            return true
        case .pending(let microseconds):
            guard arrived else { return false }
            let until = worker.clock.nowNanoseconds() + UInt64(microseconds) * 1000
            latency = .holding(until: until)
            client.armShapingTimer(at: until)
            return false
        case .holding(let until):
            if worker.clock.nowNanoseconds() >= until {
                latency = .none
                return true
            }
            client.armShapingTimer(at: until)
            return false
        }
    }

    /// How many of `wanted` bytes may pass `bucket` now. When the bucket is what holds bytes back, the shaping
    /// timer is armed for when a quantum may pass (not when the destination is full: its write event resumes
    /// the pump then). A few bytes are not moved on their own: they wait for a quantum, so a slow link costs a
    /// few wake-ups a second, not one per segment.
    /// How many of the `available` buffered bytes may move now, out of `room` (the destination's watermark room): a
    /// hard data budget's remainder (SPEC §11) and the direction's link bucket (SPEC §10) cap it. 0: nothing may
    /// move, and the shaping timer is armed for when something can. With nothing buffered, `room` is returned as is
    /// (the pump still has an end of body to notice).
    func allowedMove(room: Int, available: Int, bucket: TokenBucket?) -> Int {
        guard room > 0, available > 0 else { return room }
        var room = room
        if budgetMask != 0 {
            room = budgetRoom(room)
            guard room > 0 else { return 0 }
        }
        if let bucket { room = shapedBudget(bucket, wanted: min(room, available)) }
        return room
    }

    func shapedBudget(_ bucket: TokenBucket, wanted: Int) -> Int {
        let now = worker.clock.nowNanoseconds()
        let available = bucket.available(now: now)
        if available >= wanted { return wanted }
        let allowed = available >= bucket.quantum ? available : 0
        let waitFor = allowed == 0 ? min(bucket.quantum, wanted) : bucket.quantum
        client.armShapingTimer(at: now + bucket.delay(until: waitFor, now: now) + bucket.cost(allowed))
        return allowed
    }

    /// The session's shaping timer fired: a bucket has refilled or an added latency has passed; move what waited,
    /// or end the exchange when a hard budget it counts against is spent (SPEC §11).
    func shapingTimerFired() {
        if budgetCut {
            exchange.outcome = exchange.outcome ?? .error
            exchange.reason = AbortReason.budgetExhausted.rawValue
            client.abort(.budgetExhausted, detail: "a hard data budget is spent")
            return
        }
        guard client.machine.isRelaying else { return }
        if tunnel != nil {
            pumpTunnel(fromClient: true)
            pumpTunnel(fromClient: false)
            return
        }
        guard let upstream else { return }
        if response == nil {
            readResponseHead(upstream)
            if originClosedWhileHeld, case .none = latency, self.upstream === upstream {
                originClosedWhileHeld = false
                upstreamClosed(upstream)
            }
        } else {
            pumpResponseBody()
        }
        if isCurrent { pumpRequestBody() }
    }
}
