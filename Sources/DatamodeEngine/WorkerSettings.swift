import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy

/// The per-request view of a `RuntimeSnapshot`, derived once per snapshot so the request path reads plain
/// values (milliseconds, sets) instead of converting configuration on every request.
struct WorkerSettings {
    var limits: HTTPLimits
    /// The most bytes a request head can occupy: request line, header section, a few leading empty lines.
    var maxHeadBytes: Int
    var clientHeaderMs: Int64
    var clientIdleMs: Int64
    var upstreamConnectMs: Int64
    var upstreamResponseMs: Int64
    var drainMs: Int64
    /// The client-side timeouts as the connection state machine takes them (once per snapshot).
    var clientTimeouts: ClientConnectionStateMachine<Exchange>.Timeouts {
        .init(clientIdle: clientIdleMs, clientHeader: clientHeaderMs, drain: drainMs)
    }
    var policy: PolicySnapshot
    var mode: DataMode
    var tagSettings: TagSettings
    var users: [String: String]
    var connectPorts: Set<UInt16>
    var allow: [CIDR]
    /// SPEC §13 as configured, for a request whose session has its own mode.
    var media: MediaSection
    var images: ImagesSection
    /// SPEC §13: the manifest bitrate cap of the global mode, nil when none applies.
    var manifestCap: UInt64?
    /// SPEC §13: image transcoding settings while `images.transcode.when` is in the mode, else nil.
    var imageSettings: ImagesSection?
    var sessions: SessionSettings
    /// Which CONNECT hosts are intercepted (SPEC §9); reloadable.
    var tls: TLSSection
    /// The link profile in force under the global mode (SPEC §10), resolved once per snapshot; nil: unshaped.
    var profile: LinkProfile?
    var shapingScope: ShapingScope
    var apiProfile: String?
    var link: LinkSection
    /// The profile in force for a request judged by another mode than the global one (a session's, a spent budget's).
    func profile(for mode: DataMode) -> LinkProfile? {
        ProfileResolution(api: apiProfile, mode: mode, link: link).profile
    }

    init(_ snapshot: RuntimeSnapshot) {
        let configuration = snapshot.configuration
        limits = configuration.limits
        maxHeadBytes = limits.requestLine + 2 + limits.headerSection + 16
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
        profile = snapshot.profileInForce.profile
        shapingScope = configuration.link.scope
        apiProfile = snapshot.apiProfile
        link = configuration.link
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
