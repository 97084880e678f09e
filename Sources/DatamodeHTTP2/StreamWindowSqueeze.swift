import CNghttp2

/// Every stream's receive window lowered under pressure, and given back (either codec: the client side's
/// `HTTP2ServerSession`, the origin side's `HTTP2ClientSession`). `SETTINGS_INITIAL_WINDOW_SIZE` is the only way HTTP/2
/// has to take a granted window back: from the peer's receipt of the SETTINGS every stream's window changes by the
/// difference, the open ones' too (RFC 9113 §6.9.2), so the window granted and not used yet is taken back (a window
/// may go below zero) and new streams open with the small one. The engine decides when (its held bytes, with
/// hysteresis: each change is a SETTINGS frame the peer must answer).
struct StreamWindowSqueeze {
    /// What every stream's window is lowered to: HTTP/2's default (RFC 9113 §6.9.2), what nginx gives a stream before
    /// its handler reads the body and HAProxy gives every stream.
    static let squeezedWindow: UInt32 = 65_535

    /// The window the codec advertises otherwise (`http2.initial-window`).
    let configuredWindow: UInt32
    /// The SETTINGS lowering the windows is queued or sent, and none restored them.
    private(set) var active = false

    init(configuredWindow: UInt32) {
        self.configuredWindow = configuredWindow
    }

    /// Queues the SETTINGS that lowers the windows. False when it would change nothing (the configured window is no
    /// larger, or already squeezed) or nghttp2 refused (too many SETTINGS unacknowledged).
    mutating func squeeze(_ session: OpaquePointer) -> Bool {
        guard !active, configuredWindow > Self.squeezedWindow, Self.submit(session, Self.squeezedWindow) else { return false }
        active = true
        return true
    }

    /// Queues the SETTINGS that gives the configured window back. False when nothing changed.
    mutating func restore(_ session: OpaquePointer) -> Bool {
        guard active, Self.submit(session, configuredWindow) else { return false }
        active = false
        return true
    }

    private static func submit(_ session: OpaquePointer, _ size: UInt32) -> Bool {
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: size)]
        return nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count) == 0
    }
}
