import DatamodePolicy
import Synchronization

/// Counters of one worker. Only that worker's thread writes them; the admin plane reads all workers' counters and
/// sums them (STYLE: per-worker counters summed on read). The counters every request moves are written as their only
/// writer (`Atomic.addAsOnlyWriter`: a relaxed load and store, no locked read-modify-write); the rare ones add.
///
/// `@unchecked Sendable`: the two pointers are allocated once in `init`, never reassigned, and point to
/// `Atomic` values, so every access through them is atomic.
public final class WorkerMetrics: @unchecked Sendable {
    public static let outcomes = ["forwarded", "rewritten", "rejected", "error"]
    /// `""` = no reason; the SPEC error codes; the sides that broke off an exchange mid-way (`AbortReason`).
    public static let reasons = [""] + ProxyErrorCode.allCases.map(\.rawValue)
        + AbortReason.allCases.map(\.rawValue).filter { ProxyErrorCode(rawValue: $0) == nil }
    /// Upper bounds (seconds) of the request duration histogram.
    public static let durationBuckets: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    @usableFromInline let requests: UnsafeMutablePointer<Atomic<Int>>
    @usableFromInline let buckets: UnsafeMutablePointer<Atomic<Int>>
    @usableFromInline let durationSumMicros = Atomic<Int>(0)
    @usableFromInline let durationCount = Atomic<Int>(0)
    @usableFromInline let bytesIn = Atomic<Int>(0)
    @usableFromInline let bytesOut = Atomic<Int>(0)
    @usableFromInline let connections = Atomic<Int>(0)
    /// Grows with every exchange counted and every connection opened or closed, either side (`IdleTrim`).
    @usableFromInline let activity = Atomic<Int>(0)
    @usableFromInline let parked = Atomic<Int>(0)
    @usableFromInline let splices = Atomic<Int>(0)
    @usableFromInline let bodySplices = Atomic<Int>(0)
    @usableFromInline let upstreamReadCallbacks = Atomic<Int>(0)
    @usableFromInline let clientReadCallbacks = Atomic<Int>(0)
    @usableFromInline let shapingWakeups = Atomic<Int>(0)
    @usableFromInline let intercepted = Atomic<Int>(0)
    /// HTTP/2 on the client side (SPEC §17): connections open now, streams ever opened, errors by reason
    /// (one counter per `http2ErrorReasons` entry).
    @usableFromInline let http2Connections = Atomic<Int>(0)
    @usableFromInline let http2Streams = Atomic<Int>(0)
    private let http2Errors: UnsafeMutablePointer<Atomic<Int>>
    /// The same on the origin side: HTTP/2 connections to origins open now, streams they carried, errors.
    @usableFromInline let http2OriginConnections = Atomic<Int>(0)
    @usableFromInline let http2OriginStreams = Atomic<Int>(0)
    private let http2OriginErrors: UnsafeMutablePointer<Atomic<Int>>
    /// Connections on the transparent listener by `TransparentKind` (SPEC §16).
    private let transparentConnections: UnsafeMutablePointer<Atomic<Int>> = {
        let pointer = UnsafeMutablePointer<Atomic<Int>>.allocate(capacity: TransparentKind.allCases.count)
        for i in 0..<TransparentKind.allCases.count { (pointer + i).initialize(to: Atomic(0)) }
        return pointer
    }()
    /// One counter per `TLSFailureLabel.all` entry.
    private let handshakeFailures: UnsafeMutablePointer<Atomic<Int>>
    @usableFromInline let savedHLS = Atomic<Int>(0)
    @usableFromInline let savedVariant = Atomic<Int>(0)
    @usableFromInline let savedRejected = Atomic<Int>(0)
    @usableFromInline let savedDASH = Atomic<Int>(0)
    private let manifestsTooLarge = Atomic<Int>(0)
    private let manifestsMalformed = Atomic<Int>(0)
    @usableFromInline let savedTranscoded = Atomic<Int>(0)
    private let imagesTranscoded = Atomic<Int>(0)
    private let imageCacheHits = Atomic<Int>(0)
    private let imagesUntouched: UnsafeMutablePointer<Atomic<Int>> = {
        let pointer = UnsafeMutablePointer<Atomic<Int>>.allocate(capacity: ImagePassReason.allCases.count)
        for i in 0..<ImagePassReason.allCases.count { (pointer + i).initialize(to: Atomic(0)) }
        return pointer
    }()
    @usableFromInline let reasonIndex: [String: Int]

    public init() {
        let requestCount = Self.outcomes.count * Self.reasons.count
        requests = .allocate(capacity: requestCount)
        for i in 0..<requestCount { (requests + i).initialize(to: Atomic(0)) }
        buckets = .allocate(capacity: Self.durationBuckets.count)
        for i in 0..<Self.durationBuckets.count { (buckets + i).initialize(to: Atomic(0)) }
        handshakeFailures = .allocate(capacity: TLSFailureLabel.all.count)
        for i in 0..<TLSFailureLabel.all.count { (handshakeFailures + i).initialize(to: Atomic(0)) }
        http2Errors = .allocate(capacity: Self.http2ErrorReasons.count)
        for i in 0..<Self.http2ErrorReasons.count { (http2Errors + i).initialize(to: Atomic(0)) }
        http2OriginErrors = .allocate(capacity: Self.http2ErrorReasons.count)
        for i in 0..<Self.http2ErrorReasons.count { (http2OriginErrors + i).initialize(to: Atomic(0)) }
        var index: [String: Int] = [:]
        for (i, reason) in Self.reasons.enumerated() { index[reason] = i }
        reasonIndex = index
    }

    deinit {
        requests.deinitialize(count: Self.outcomes.count * Self.reasons.count)
        requests.deallocate()
        buckets.deinitialize(count: Self.durationBuckets.count)
        buckets.deallocate()
        handshakeFailures.deinitialize(count: TLSFailureLabel.all.count)
        handshakeFailures.deallocate()
        http2Errors.deinitialize(count: Self.http2ErrorReasons.count)
        http2Errors.deallocate()
        http2OriginErrors.deinitialize(count: Self.http2ErrorReasons.count)
        http2OriginErrors.deallocate()
        imagesUntouched.deinitialize(count: ImagePassReason.allCases.count)
        imagesUntouched.deallocate()
        transparentConnections.deinitialize(count: TransparentKind.allCases.count)
        transparentConnections.deallocate()
    }

    /// Counts a finished request; returns the index of its outcome × reason counter (a session's tally uses the same).
    @inlinable @discardableResult
    package func count(outcome: Outcome, reason: String?, durationSeconds: Double) -> Int {
        let o: Int
        switch outcome {
        case .forwarded: o = 0
        case .rewritten: o = 1
        case .rejected: o = 2
        case .error: o = 3
        }
        // Every reason comes from `ProxyErrorCode` or `AbortReason`; anything else would be counted without one.
        let r = reason.map { reasonIndex[$0] ?? 0 } ?? 0
        let index = o * Self.reasons.count + r
        requests[index].addAsOnlyWriter(1)
        for (i, bound) in Self.durationBuckets.enumerated() where durationSeconds <= bound {
            buckets[i].addAsOnlyWriter(1)
            break
        }
        durationSumMicros.addAsOnlyWriter(Int(durationSeconds * 1_000_000))
        durationCount.addAsOnlyWriter(1)
        activity.addAsOnlyWriter(1)
        return index
    }

    @inlinable package func add(bytesIn n: Int) { bytesIn.addAsOnlyWriter(n) }
    @inlinable package func add(bytesOut n: Int) { bytesOut.addAsOnlyWriter(n) }
    @inlinable package func connectionOpened() {
        connections.addAsOnlyWriter(1)
        activity.addAsOnlyWriter(1)
    }
    @inlinable package func connectionClosed() {
        connections.addAsOnlyWriter(-1)
        activity.addAsOnlyWriter(1)
    }
    @inlinable package func upstreamOpenedOrClosed() { activity.addAsOnlyWriter(1) }
    /// A count that only grows with this worker's work: exchanges, and connections opened and closed on either side.
    package var activityCount: Int { activity.load(ordering: .relaxed) }
    @inlinable package func connectionParked() { parked.addAsOnlyWriter(1) }
    @inlinable package func connectionUnparked() { parked.addAsOnlyWriter(-1) }
    @inlinable package func tunnelSpliced() { splices.add(1, ordering: .relaxed) }
    @inlinable package func bodySpliced() { bodySplices.add(1, ordering: .relaxed) }
    @inlinable package func upstreamReadCallback() { upstreamReadCallbacks.addAsOnlyWriter(1) }
    @inlinable package func clientReadCallback() { clientReadCallbacks.addAsOnlyWriter(1) }
    @inlinable package func shapingTimerFired() { shapingWakeups.add(1, ordering: .relaxed) }
    @inlinable package func tlsIntercepted() { intercepted.add(1, ordering: .relaxed) }
    @inlinable package func http2ConnectionOpened() { http2Connections.add(1, ordering: .relaxed) }
    @inlinable package func http2ConnectionClosed() { http2Connections.subtract(1, ordering: .relaxed) }
    @inlinable package func http2StreamOpened() { http2Streams.add(1, ordering: .relaxed) }
    /// `reason`: an entry of `http2ErrorReasons` (the codec's `HTTP2LimitReason` raw values and its connection
    /// errors' labels); anything else is counted as `protocol-error`.
    package func http2Error(_ reason: String) {
        let index = Self.http2ErrorReasons.firstIndex(of: reason) ?? Self.http2ErrorReasons.firstIndex(of: "protocol-error")!
        http2Errors[index].add(1, ordering: .relaxed)
    }
    @inlinable package func http2OriginConnectionOpened() { http2OriginConnections.add(1, ordering: .relaxed) }
    @inlinable package func http2OriginConnectionClosed() { http2OriginConnections.subtract(1, ordering: .relaxed) }
    @inlinable package func http2OriginStreamOpened() { http2OriginStreams.add(1, ordering: .relaxed) }
    /// An origin broke HTTP/2's rules (`reason` as for `http2Error`).
    package func http2OriginError(_ reason: String) {
        let index = Self.http2ErrorReasons.firstIndex(of: reason) ?? Self.http2ErrorReasons.firstIndex(of: "protocol-error")!
        http2OriginErrors[index].add(1, ordering: .relaxed)
    }
    /// The `reason` labels of `datamode_http2_errors_total` (SPEC §17), every one exported.
    public static let http2ErrorReasons = ["rapid-reset", "continuation-flood", "header-too-large", "hpack-bomb",
                                           "settings-flood", "ping-flood", "empty-frames", "too-many-streams",
                                           "outbound-flood", "protocol-error", "internal-error"]
    package func transparentConnection(_ kind: TransparentKind) {
        transparentConnections[kind.index].add(1, ordering: .relaxed)
    }
    package func tlsHandshakeFailed(_ side: TLSFailureLabel.Side, _ reason: TLSFailureReason) {
        guard let index = TLSFailureLabel.all.firstIndex(of: TLSFailureLabel(side: side, reason: reason)) else { return }
        handshakeFailures[index].add(1, ordering: .relaxed)
    }

    /// What a mechanism of SPEC §13 saved (`datamode_bytes_saved_total{kind}`).
    @usableFromInline package enum SavingKind { case variant, rejected, hlsCap, dashCap, transcoded }
    @inlinable package func saved(_ kind: SavingKind, bytes: Int) {
        switch kind {
        case .variant: savedVariant.add(bytes, ordering: .relaxed)
        case .rejected: savedRejected.add(bytes, ordering: .relaxed)
        case .hlsCap: savedHLS.add(bytes, ordering: .relaxed)
        case .dashCap: savedDASH.add(bytes, ordering: .relaxed)
        case .transcoded: savedTranscoded.add(bytes, ordering: .relaxed)
        }
    }

    package func imageTranscoded() { imagesTranscoded.add(1, ordering: .relaxed) }
    package func imageCacheHit() { imageCacheHits.add(1, ordering: .relaxed) }

    /// Why an image under transcoding was passed through untouched (`datamode_images_untouched_total{reason}`).
    /// `too-many-scans` and `too-slow`: the transcode ran into `ImageLimits` and was given up.
    package enum ImagePassReason: String, CaseIterable {
        case tooLarge = "too-large", tooManyPixels = "too-many-pixels", animated, undecodable,
             notSmaller = "not-smaller", busy, tooManyScans = "too-many-scans", tooSlow = "too-slow"
    }
    package func imagePassed(_ reason: ImagePassReason) {
        imagesUntouched[ImagePassReason.allCases.firstIndex(of: reason)!].add(1, ordering: .relaxed)
    }

    /// Why a manifest under a cap was passed through untouched (`datamode_manifests_untouched_total{reason}`).
    package enum ManifestPassReason { case tooLarge, malformed }
    package func manifestPassed(_ reason: ManifestPassReason) {
        switch reason {
        case .tooLarge: manifestsTooLarge.add(1, ordering: .relaxed)
        case .malformed: manifestsMalformed.add(1, ordering: .relaxed)
        }
    }

    /// Adds this worker's values into `total`.
    package func accumulate(into total: inout MetricsSnapshot) {
        for o in 0..<Self.outcomes.count {
            for r in 0..<Self.reasons.count {
                let value = requests[o * Self.reasons.count + r].load(ordering: .relaxed)
                if value > 0 { total.requests[RequestLabel(outcome: Self.outcomes[o], reason: Self.reasons[r]), default: 0] += value }
            }
        }
        for i in 0..<Self.durationBuckets.count { total.durationBuckets[i] += buckets[i].load(ordering: .relaxed) }
        total.durationSumSeconds += Double(durationSumMicros.load(ordering: .relaxed)) / 1_000_000
        total.durationCount += durationCount.load(ordering: .relaxed)
        total.bytesIn += bytesIn.load(ordering: .relaxed)
        total.bytesOut += bytesOut.load(ordering: .relaxed)
        total.connectionsActive += connections.load(ordering: .relaxed)
        total.connectionsParked += parked.load(ordering: .relaxed)
        total.tunnelSplices += splices.load(ordering: .relaxed)
        total.bodySplices += bodySplices.load(ordering: .relaxed)
        total.upstreamReadCallbacks += upstreamReadCallbacks.load(ordering: .relaxed)
        total.clientReadCallbacks += clientReadCallbacks.load(ordering: .relaxed)
        total.shapingWakeups += shapingWakeups.load(ordering: .relaxed)
        total.tlsIntercepted += intercepted.load(ordering: .relaxed)
        total.http2ConnectionsActive += http2Connections.load(ordering: .relaxed)
        total.http2Streams += http2Streams.load(ordering: .relaxed)
        for (i, reason) in Self.http2ErrorReasons.enumerated() {
            total.http2Errors[reason, default: 0] += http2Errors[i].load(ordering: .relaxed)
            total.http2OriginErrors[reason, default: 0] += http2OriginErrors[i].load(ordering: .relaxed)
        }
        total.http2OriginConnectionsActive += http2OriginConnections.load(ordering: .relaxed)
        total.http2OriginStreams += http2OriginStreams.load(ordering: .relaxed)
        for kind in TransparentKind.allCases {
            total.transparentConnections[kind.rawValue, default: 0] += transparentConnections[kind.index].load(ordering: .relaxed)
        }
        for (i, label) in TLSFailureLabel.all.enumerated() {
            total.tlsHandshakeFailures[label, default: 0] += handshakeFailures[i].load(ordering: .relaxed)
        }
        total.bytesSaved["variant", default: 0] += savedVariant.load(ordering: .relaxed)
        total.bytesSaved["rejected", default: 0] += savedRejected.load(ordering: .relaxed)
        total.bytesSaved["hls-cap", default: 0] += savedHLS.load(ordering: .relaxed)
        total.bytesSaved["dash-cap", default: 0] += savedDASH.load(ordering: .relaxed)
        total.manifestsUntouched["too-large", default: 0] += manifestsTooLarge.load(ordering: .relaxed)
        total.manifestsUntouched["malformed", default: 0] += manifestsMalformed.load(ordering: .relaxed)
        total.bytesSaved["transcoded", default: 0] += savedTranscoded.load(ordering: .relaxed)
        total.imagesTranscoded += imagesTranscoded.load(ordering: .relaxed)
        total.imageCacheHits += imageCacheHits.load(ordering: .relaxed)
        for (i, reason) in ImagePassReason.allCases.enumerated() {
            total.imagesUntouched[reason.rawValue, default: 0] += imagesUntouched[i].load(ordering: .relaxed)
        }
    }
}

public struct RequestLabel: Hashable, Sendable {
    public var outcome: String
    public var reason: String
    public init(outcome: String, reason: String) {
        self.outcome = outcome
        self.reason = reason
    }
}

/// The sum of every worker's counters at one moment.
public struct MetricsSnapshot: Sendable {
    public var requests: [RequestLabel: Int] = [:]
    /// Per-bucket (not cumulative) counts, aligned with `WorkerMetrics.durationBuckets`.
    public var durationBuckets = [Int](repeating: 0, count: WorkerMetrics.durationBuckets.count)
    public var durationSumSeconds: Double = 0
    public var durationCount = 0
    public var bytesIn = 0
    public var bytesOut = 0
    public var connectionsActive = 0
    /// Open client connections idle with their buffers freed (`HTTP1SessionStateMachine.State.parked`).
    public var connectionsParked = 0
    public var tunnelSplices = 0
    /// Content-Length response bodies handed to splice(2).
    public var bodySplices = 0
    /// Read callbacks of origin connections: how often a worker woke for origin bytes (not on /metrics; tests count
    /// wake-ups with it, where a busy loop shows as hundreds of thousands a second).
    public var upstreamReadCallbacks = 0
    /// The same for HTTP/1 client connections.
    public var clientReadCallbacks = 0
    /// Shaping timers fired (a bucket refilled, a latency passed, SPEC §10): how often shaped traffic woke a worker
    /// (not on /metrics; tests count wake-ups with it).
    public var shapingWakeups = 0
    /// SPEC §13 `datamode_bytes_saved_total{kind}`: bytes the clients did not receive, by mechanism.
    public var bytesSaved: [String: Int] = [:]
    /// Manifests under a cap passed through untouched, by reason (`too-large`, `malformed`).
    public var manifestsUntouched: [String: Int] = [:]
    /// Images transcoded, and images under transcoding passed through untouched by reason.
    public var imagesTranscoded = 0
    /// Transcoded images answered from the cache (counted in `imagesTranscoded` too).
    public var imageCacheHits = 0
    public var imagesUntouched: [String: Int] = [:]
    /// Access log lines dropped because the destination did not keep up (SPEC §8).
    public var logDropped = 0
    /// Requests held now for their refusal to lift (SPEC §18.2).
    public var heldRequests = 0
    /// `datamode_deferred_total{outcome}` (SPEC §18.3), every outcome.
    public var deferred: [(outcome: String, count: Int)] = []
    /// The live deferral queue: entries and body bytes.
    public var deferredQueueEntries = 0
    public var deferredQueueBytes: UInt64 = 0
    /// Intercepted tunnels whose client handshake completed (SPEC §9).
    public var tlsIntercepted = 0
    /// HTTP/2 client connections open, streams opened, errors by reason (SPEC §17).
    public var http2ConnectionsActive = 0
    public var http2Streams = 0
    public var http2Errors: [String: Int] = [:]
    /// The same for HTTP/2 connections to origins.
    public var http2OriginConnectionsActive = 0
    public var http2OriginStreams = 0
    public var http2OriginErrors: [String: Int] = [:]
    /// Connections on the transparent listener by kind (`TransparentKind`'s raw values, SPEC §16).
    public var transparentConnections: [String: Int] = [:]
    /// Failed TLS handshakes by side and reason (every label present, zeros included).
    public var tlsHandshakeFailures: [TLSFailureLabel: Int] = [:]
    public init() {}
}

/// What a connection on the transparent listener turned out to be (SPEC §16): the `kind` label of
/// `datamode_transparent_connections_total`. A TLS connection that is not intercepted (relayed blind, or refused
/// by the host-level decision) is a `tls-tunnel`.
public enum TransparentKind: String, Sendable, CaseIterable {
    case http
    case tlsIntercepted = "tls-intercepted"
    case tlsTunnel = "tls-tunnel"
    case other

    var index: Int { Self.allCases.firstIndex(of: self)! }
}

/// Why a TLS handshake failed, in a few stable words (the `reason` label of
/// `datamode_tls_handshake_failures_total`).
public enum TLSFailureReason: String, Sendable, CaseIterable {
    /// The client refused the leaf (an alert such as unknown_ca or bad_certificate): it does not trust the CA.
    case rejectedCertificate = "rejected-certificate"
    /// The peer closed during the handshake.
    case closed
    /// Anything else (no common version or cipher, a malformed message, no leaf for the name).
    case protocolError = "protocol-error"
    /// The origin's certificate did not verify (untrusted, expired, wrong name).
    case verifyFailed = "verify-failed"
}

/// A `datamode_tls_handshake_failures_total{side,reason}` series.
public struct TLSFailureLabel: Hashable, Sendable {
    public enum Side: String, Sendable {
        /// Between the client and the proxy (interception).
        case client
        /// Between the proxy and an origin.
        case origin
    }
    public var side: Side
    public var reason: TLSFailureReason

    public init(side: Side, reason: TLSFailureReason) {
        self.side = side
        self.reason = reason
    }

    /// Every series, in the order they are exported.
    public static let all: [TLSFailureLabel] = [
        .init(side: .client, reason: .rejectedCertificate), .init(side: .client, reason: .closed),
        .init(side: .client, reason: .protocolError),
        .init(side: .origin, reason: .verifyFailed), .init(side: .origin, reason: .closed),
        .init(side: .origin, reason: .protocolError),
    ]
}

extension Atomic where Value == Int {
    /// Adds `n` as this counter's only writer: a relaxed load and a relaxed store rather than a locked
    /// read-modify-write (about 20 cycles each, ~10 a plain request). Readers on other threads still see whole values,
    /// each at least as new as the last they saw. Only for a counter one thread writes (`WorkerMetrics`).
    @inlinable package func addAsOnlyWriter(_ n: Int) {
        store(load(ordering: .relaxed) &+ n, ordering: .relaxed)
    }
}
