/// The transparent sidecar listener (SPEC §16): connections the kernel redirected to the proxy (iptables
/// `REDIRECT`), whose original destination the proxy reads back from the socket.
public struct TransparentSection: Sendable, Equatable {
    /// `transparent.listen`: where redirected connections arrive, e.g. `127.0.0.1:15001` or `[::]:15001`;
    /// nil (the default) = no transparent listener.
    public var listen: ListenAddress?

    public init(listen: ListenAddress? = nil) {
        self.listen = listen
    }
}

extension ConfigParser {
    /// `transparent: {listen}` (SPEC §16).
    func transparent(_ node: ConfigNode) throws(ConfigError) -> TransparentSection {
        var transparent = TransparentSection()
        if node.isNull { return transparent }
        let section = try node.section(known: ["listen"])
        if let value = section["listen"], !value.isNull { transparent.listen = try value.listenAddress() }
        return transparent
    }
}
