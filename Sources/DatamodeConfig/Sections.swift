import DatamodePolicy

/// An address to listen on: an IP literal and a port (SPEC §6 `listen`, §7 `admin.listen`).
///
/// Only IP literals are accepted (`127.0.0.1:8877`, `[::1]:8877`, `0.0.0.0:0`), never host names: what a
/// listener binds to must not depend on a resolver at start-up, and whether the admin API is exposed beyond
/// loopback (SPEC §7) must be decidable from the configuration alone. Port 0 asks the kernel for any free port.
public struct ListenAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address to bind.
    public var address: IPAddress
    public var port: UInt16

    /// The IP literal in canonical form (RFC 5952 for IPv6), without brackets: `127.0.0.1`, `::1`.
    public var host: String { address.description }

    public init(address: IPAddress, port: UInt16) {
        self.address = address
        self.port = port
    }

    /// Parses `IPv4:port` or `[IPv6]:port`; `nil` for anything else (a host name, a missing port, an
    /// unbracketed IPv6 literal, a port above 65535).
    public init?(_ text: String) {
        let hostPart: Substring
        let portPart: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            hostPart = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { return nil }
            portPart = rest.dropFirst()
            guard hostPart.contains(":") else { return nil }
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            hostPart = text[..<colon]
            portPart = text[text.index(after: colon)...]
            // An unbracketed IPv6 literal is ambiguous with its port: refuse it.
            guard !hostPart.contains(":") else { return nil }
        }
        guard !hostPart.isEmpty, !portPart.isEmpty, portPart.count <= 5,
              portPart.allSatisfy({ $0.isASCII && $0.isNumber }),
              let port = UInt16(portPart),
              let address = IPAddress(String(hostPart)) else { return nil }
        self.init(address: address, port: port)
    }

    /// `127.0.0.1:8877` or `[::1]:8877`.
    public var description: String {
        address.bytes.count == 16 ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// True for 127.0.0.0/8 and ::1 (and IPv4-mapped loopback): only this machine can connect.
    /// The admin API refuses to run elsewhere without a token (SPEC §7).
    public var isLoopback: Bool {
        let bytes = address.bytes
        if bytes.count == 4 { return bytes[0] == 127 }
        if bytes[0..<15].allSatisfy({ $0 == 0 }) && bytes[15] == 1 { return true }
        // ::ffff:127.x.y.z
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF { return bytes[12] == 127 }
        return false
    }
}

/// The admin listener (SPEC §7).
public struct AdminSection: Sendable, Equatable {
    /// Where the admin API listens; default `127.0.0.1:8878`.
    public var listen: ListenAddress
    /// Bearer token required on every admin request when set; `nil` = no token (allowed on loopback only).
    public var token: String?
    /// A second bearer token that grants only the read endpoints a client-side path monitor needs (`GET /mode`,
    /// `GET /events`, SPEC §7), without the power to change anything; `nil` = none.
    public var readToken: String?

    public init(listen: ListenAddress = ListenAddress.defaultAdmin, token: String? = nil, readToken: String? = nil) {
        self.listen = listen
        self.token = token
        self.readToken = readToken
    }
}

/// Sessions for test rigs (SPEC §12): named scopes with their own mode and counters.
public struct SessionsSection: Sendable, Equatable {
    /// Off by default: without it `Data-Mode-Session` is ignored (and still removed before forwarding).
    public var enabled: Bool
    /// Only clients in these blocks may choose a session; others are judged by the global mode.
    public var clients: [CIDR]
    /// The proxy-auth user names the session (a `Data-Mode-Session` naming another one is `400`).
    public var fromProxyUser: Bool
    /// A session without traffic or API calls for this long is forgotten.
    public var idleExpiry: Duration

    public init(enabled: Bool = false, clients: [CIDR] = AccessSection.loopback, fromProxyUser: Bool = false,
                idleExpiry: Duration = .seconds(3600)) {
        self.enabled = enabled
        self.clients = clients
        self.fromProxyUser = fromProxyUser
        self.idleExpiry = idleExpiry
    }
}

/// `CONNECT` tunnels (SPEC §6).
public struct ConnectSection: Sendable, Equatable {
    /// Destination ports a `CONNECT` may open; any other: `403 connect-port-denied`. Default `[443]`.
    public var ports: [UInt16]

    public init(ports: [UInt16] = [443]) {
        self.ports = ports
    }

    public func allows(port: UInt16) -> Bool { ports.contains(port) }
}

/// Who may use the proxy (SPEC §6 "Access").
public struct AccessSection: Sendable, Equatable {
    /// Client addresses allowed to connect; anyone else gets `403 access-denied`. Default loopback only.
    public var allow: [CIDR]
    /// Basic proxy authentication: user name to password. Any entry turns authentication on (`407`).
    public var users: [String: String]

    public init(allow: [CIDR] = AccessSection.loopback, users: [String: String] = [:]) {
        self.allow = allow
        self.users = users
    }

    /// `127.0.0.0/8` and `::1/128`.
    public static let loopback: [CIDR] = [
        CIDR(network: IPAddress(bytes: [127, 0, 0, 0])!, prefixLength: 8),
        CIDR(network: IPAddress(bytes: [UInt8](repeating: 0, count: 15) + [1])!, prefixLength: 128),
    ]

    /// True when any user is configured: clients must send `Proxy-Authorization: Basic …`.
    public var requiresAuthentication: Bool { !users.isEmpty }
}

/// Timers of a connection's life (SPEC §6 defaults).
public struct TimeoutsSection: Sendable, Equatable {
    /// From accepting a connection (or finishing the previous response) to a whole request head. Default 15 s.
    public var clientHeader: Duration
    /// How long an idle keep-alive client connection is kept. Default 60 s.
    public var clientIdle: Duration
    /// To establish the TCP connection to an origin. Default 10 s; over it: `504 upstream-timeout`.
    public var upstreamConnect: Duration
    /// From sending a request to the origin to its whole response head. Default 60 s.
    public var upstreamResponse: Duration

    public init(clientHeader: Duration = .seconds(15), clientIdle: Duration = .seconds(60),
                upstreamConnect: Duration = .seconds(10), upstreamResponse: Duration = .seconds(60)) {
        self.clientHeader = clientHeader
        self.clientIdle = clientIdle
        self.upstreamConnect = upstreamConnect
        self.upstreamResponse = upstreamResponse
    }
}

/// Where the access log (one JSON line per request, SPEC §8) goes.
public enum AccessLogDestination: Sendable, Hashable {
    case stdout
    case off
    /// A file path, kept as written (a relative path is relative to the working directory).
    case file(String)
}

/// Logging (SPEC §8).
public struct LogSection: Sendable, Equatable {
    public var access: AccessLogDestination

    public init(access: AccessLogDestination = .stdout) {
        self.access = access
    }
}

extension ListenAddress {
    /// `127.0.0.1:8877`, the proxy's default listener.
    public static let defaultProxy = ListenAddress(address: IPAddress(bytes: [127, 0, 0, 1])!, port: 8877)
    /// `127.0.0.1:8878`, the admin API's default listener.
    public static let defaultAdmin = ListenAddress(address: IPAddress(bytes: [127, 0, 0, 1])!, port: 8878)
}
