import DatamodePolicy

/// Which data mode is in force and why (SPEC §2): the mode set through the admin API (persisted), else
/// `--mode` / `DATAMODE_MODE`, else the config file's `mode`, else `normal`.
///
/// The one implementation of that precedence, used at start-up, on `SIGHUP` and by `PUT`/`DELETE /mode`. A pure
/// value: the caller reads the inputs (the state directory, the configuration) and publishes the result.
public struct ModeResolution: Sendable, Hashable {
    /// The mode set through the admin API and persisted in `state-dir`; `nil` when none is set (or after `DELETE /mode`).
    public var api: DataMode?
    /// `--mode`, or `DATAMODE_MODE` when the flag is absent.
    public var flag: DataMode?
    /// The config file's `mode`.
    public var file: DataMode?

    public init(api: DataMode? = nil, flag: DataMode? = nil, file: DataMode? = nil) {
        self.api = api
        self.flag = flag
        self.file = file
    }

    /// The API mode `api` over what `configuration` asks for. A configuration keeps one `mode`, the override's when
    /// one was given (`applying` replaces the file's): all precedence needs, since a flag beats the file anyway.
    public init(api: DataMode?, configuration: ProxyConfiguration) {
        self.init(api: api,
                  flag: configuration.modeSetByOverride ? configuration.mode : nil,
                  file: configuration.modeSetByOverride ? nil : configuration.mode)
    }

    /// The mode in force.
    public var mode: DataMode { api ?? flag ?? file ?? .normal }

    /// Where `mode` comes from (`GET /mode` `source`).
    public var source: ModeSource {
        if api != nil { return .api }
        if flag != nil { return .flag }
        if file != nil { return .config }
        return .default
    }

    /// When the resolved mode took effect (`GET /mode` `since`), given the mode and source it replaces and when
    /// that one took effect: `now` if the mode changed, or if it passed to or from the admin API (a `PUT` of the
    /// mode already in force still starts the API's hold on it); else `previousSince`, so a reload that
    /// changes nothing, or only moves the mode from the file to a flag, keeps it.
    public func since(replacing previous: DataMode, from previousSource: ModeSource, since previousSince: Int64,
                      now: Int64) -> Int64 {
        let changed = mode != previous || (source == .api) != (previousSource == .api)
        return changed ? now : previousSince
    }
}
