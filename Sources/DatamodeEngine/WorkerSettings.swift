import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState

/// The per-request view of a `RuntimeSnapshot`, derived once per snapshot so the request path reads plain
/// values (milliseconds, sets, per-mode tables) instead of converting configuration on every request.
///
/// A class, immutable: the request path takes `worker.settings` several times per request, and as a struct of
/// two dozen reference-counted fields every such copy retained and released each of them (the merged features
/// grew it; `WorkerSettings` value-witness copies showed in the 1 KiB profile). A new snapshot makes a new object.
final class WorkerSettings {
    let limits: HTTPLimits
    /// The most bytes a request head can occupy: request line, header section, a few leading empty lines.
    let maxHeadBytes: Int
    let clientHeaderMs: Int64
    let clientIdleMs: Int64
    let upstreamConnectMs: Int64
    let upstreamResponseMs: Int64
    let drainMs: Int64
    /// The client-side timeouts as the connection state machine takes them (once per snapshot).
    var clientTimeouts: HTTP1SessionStateMachine<ExchangeDriver>.Timeouts {
        .init(clientIdle: clientIdleMs, clientHeader: clientHeaderMs, drain: drainMs)
    }
    let policy: PolicySnapshot
    let mode: DataMode
    let tagSettings: TagSettings
    let users: [String: String]
    let connectPorts: Set<UInt16>
    let allow: [CIDR]
    /// SPEC §13 as configured, for a request whose session has its own mode.
    let media: MediaSection
    let images: ImagesSection
    /// SPEC §13: the manifest bitrate cap of the global mode, nil when none applies.
    let manifestCap: UInt64?
    /// SPEC §13: image transcoding settings while `images.transcode.when` is in the mode, else nil.
    let imageSettings: ImagesSection?
    let sessions: SessionSettings
    /// Which CONNECT hosts are intercepted (SPEC §9); reloadable.
    let tls: TLSSection
    /// HTTP/2 to clients inside interception (SPEC §17): whether `h2` is offered, and the codec's settings.
    let http2: HTTP2Section
    /// The link profile in force under the global mode (SPEC §10), resolved once per snapshot; nil: unshaped.
    let profile: LinkProfile?
    let shapingScope: ShapingScope
    let apiProfile: String?
    let link: LinkSection
    /// The running schedules' steps to come, by scope (`""`: global), for a refusal's `liftsAt` (SPEC §18.1).
    let scheduleOutlooks: [String: ScheduleOutlook]
    /// Holding and storing refused requests (SPEC §18).
    let deferral: DeferralSection
    /// The `hold` of every rule that has one, by rule name (SPEC §18.2).
    let ruleHolds: [String: Duration]
    /// Per mode (indexed by `DataMode.index`): the link profile in force, the manifest cap and whether images are
    /// transcoded, for a request judged by another mode than the global one (a session's, a spent budget's):
    /// resolving them per request built arrays and copied sections (1,000-session policy row, issue 15).
    private let profileByMode: [LinkProfile?]
    private let manifestCapByMode: [UInt64?]
    private let imagesApplyByMode: [Bool]

    /// The profile in force for a request judged by `mode` (SPEC §10 precedence; `PUT /conditions` first).
    func profile(for mode: DataMode) -> LinkProfile? { profileByMode[mode.index] }
    /// The manifest bitrate cap under `mode` (SPEC §13), nil when none applies.
    func manifestCap(in mode: DataMode) -> UInt64? { manifestCapByMode[mode.index] }
    /// Whether images are transcoded under `mode` (SPEC §13).
    func imagesApply(in mode: DataMode) -> Bool { imagesApplyByMode[mode.index] }

    init(_ snapshot: RuntimeSnapshot) {
        let configuration = snapshot.configuration
        limits = configuration.limits
        maxHeadBytes = configuration.limits.maxRequestHeadBytes
        clientHeaderMs = configuration.timeouts.clientHeader.milliseconds
        clientIdleMs = configuration.timeouts.clientIdle.milliseconds
        upstreamConnectMs = configuration.timeouts.upstreamConnect.milliseconds
        upstreamResponseMs = configuration.timeouts.upstreamResponse.milliseconds
        drainMs = configuration.drainTimeout.milliseconds
        policy = snapshot.policy
        mode = snapshot.mode
        tagSettings = snapshot.policy.tagSettings
        users = configuration.access.users
        connectPorts = Set(configuration.connect.ports)
        allow = configuration.access.allow
        media = configuration.media
        images = configuration.images
        manifestCap = configuration.media.manifestCap(in: snapshot.mode)
        imageSettings = configuration.images.applies(in: snapshot.mode) ? configuration.images : nil
        sessions = SessionSettings(snapshot)
        tls = configuration.tls
        http2 = configuration.http2
        profile = snapshot.profileInForce.profile
        shapingScope = configuration.link.scope
        apiProfile = snapshot.apiProfile
        link = configuration.link
        scheduleOutlooks = snapshot.scheduleOutlooks
        deferral = configuration.deferral
        ruleHolds = Dictionary(snapshot.policy.rules.compactMap { rule in rule.hold.map { (rule.name, $0) } },
                               uniquingKeysWith: { first, _ in first })
        profileByMode = DataMode.all.map { [apiProfile = snapshot.apiProfile] mode in
            ProfileResolution(api: apiProfile, mode: mode, link: configuration.link).profile
        }
        manifestCapByMode = DataMode.all.map { configuration.media.manifestCap(in: $0) }
        imagesApplyByMode = DataMode.all.map { configuration.images.applies(in: $0) }
    }
}

extension Duration {
    /// Whole milliseconds, at least 1 for any positive duration.
    public var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        let ms = seconds * 1000 + attoseconds / 1_000_000_000_000_000
        return ms == 0 && attoseconds > 0 ? 1 : ms
    }
}
