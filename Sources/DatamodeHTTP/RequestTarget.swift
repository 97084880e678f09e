/// A request-target (RFC 9112 §3.2) taken apart into what a forward proxy needs: where to connect, what to put
/// in `Host`, which origin-form path to send, and one canonical URL for policy rules.
///
/// Strict on purpose: the proxy decides (policy, Host, upstream) from this value and the origin acts on the bytes
/// it is sent, so any target the two could read differently is refused. Userinfo (`user@host`) is the classic
/// one: `http://allowed.example@evil.example/` names evil.example, but naive matchers see allowed.example.
public struct RequestTarget: Hashable, Sendable {
    public enum Form: Hashable, Sendable {
        /// `/path?query` (RFC 9112 §3.2.1): a request meant for an origin server, not for a proxy.
        case origin
        /// `http://host[:port]/path?query` (RFC 9112 §3.2.2): what clients send to a forward proxy.
        case absolute
        /// `host:port` (RFC 9112 §3.2.3): CONNECT only.
        case authority
        /// `*` (RFC 9112 §3.2.4): OPTIONS only.
        case asterisk
    }

    public var form: Form
    /// "http" or "https", lowercased; "" for origin, authority and asterisk form.
    public var scheme: String
    /// Lowercased (RFC 3986 §3.2.2: the host is case-insensitive); IPv6 without brackets; "" for origin/asterisk.
    public var host: String
    /// The explicit port, or the scheme default (80/443); required in authority form; 0 for origin/asterisk.
    public var port: UInt16
    /// Path and `?query` as sent (percent-encoding untouched); "/" when an absolute-form path is empty
    /// (RFC 9112 §3.2.1); "" in authority form; "*" in asterisk form.
    public var path: String
    /// The `Host` field value for the origin (RFC 9110 §7.2): host, plus `:port` when the port is not the
    /// scheme default; IPv6 in brackets. Authority form has no scheme, so it always carries the port.
    /// "" for origin/asterisk form.
    public var hostHeaderValue: String
    /// `scheme://hostHeaderValue` + path: one spelling per resource, for policy rules and logs.
    /// Authority form: `host:port`. Origin form: the path. Asterisk form: "*".
    public var absoluteURL: String

    public init(
        form: Form, scheme: String, host: String, port: UInt16, path: String,
        hostHeaderValue: String, absoluteURL: String
    ) {
        self.form = form
        self.scheme = scheme
        self.host = host
        self.port = port
        self.path = path
        self.hostHeaderValue = hostHeaderValue
        self.absoluteURL = absoluteURL
    }

    /// Parses `target` as the request-target of a request with `method` (methods are case-sensitive).
    public static func parse(_ target: String, method: String) -> Result<RequestTarget, HTTPWireError> {
        return target.withUTF8Bytes { u in parse(u, method: method, spelled: target) }
    }

    /// `parse` without its shortcut for targets already in their one spelling (`canonicalAbsolute`): the reference
    /// the shortcut is held to (`CanonicalTargetDifferentialTests`, the fuzz target).
    public static func parseInFull(_ target: String, method: String) -> Result<RequestTarget, HTTPWireError> {
        return target.withUTF8Bytes { u in parseInFull(u, method: method, spelled: target) }
    }

    /// `spelled`: the target as a String, when the caller has one: an absolute-form target already in its one
    /// spelling (lowercase scheme and host, the port as `hostHeaderValue` writes it, a path) is its own
    /// `absoluteURL`, and is not built again (a forward proxy's every request; ~600 instructions, callgrind).
    static func parse(_ u: UnsafeBufferPointer<UInt8>, method: String, spelled: String? = nil) -> Result<RequestTarget, HTTPWireError> {
        if let spelled, method != "CONNECT", let target = canonicalAbsolute(u, spelled: spelled) { return .success(target) }
        return parseInFull(u, method: method, spelled: spelled)
    }

    /// The target as a forward proxy's clients nearly always send it, read in one pass: `http://` or `https://`, a
    /// host of lowercase reg-name characters (an IPv4 address is one), a port only when it is not the scheme's and
    /// without leading zeros, then a path: the one spelling `parse` writes back, so `spelled` is its `absoluteURL`
    /// and its authority its `Host`. nil for anything else (uppercase, percent-encoding, an IPv6 literal, userinfo, a
    /// query or nothing right after the authority, a byte `parse` refuses...), which `parseInFull` then reads. Not
    /// for CONNECT (authority-form only). ~1,100 instructions under `parseInFull`'s on a plain request (callgrind).
    static func canonicalAbsolute(_ u: UnsafeBufferPointer<UInt8>, spelled: String) -> RequestTarget? {
        let n = u.count
        guard n > 8, u[0] == 0x68, u[1] == 0x74, u[2] == 0x74, u[3] == 0x70 else { return nil }  // "http"
        let scheme: String
        let defaultPort: Int
        var i: Int
        if u[4] == 0x3A {
            scheme = "http"; defaultPort = 80; i = 5
        } else if u[4] == 0x73 && u[5] == 0x3A {
            scheme = "https"; defaultPort = 443; i = 6
        } else {
            return nil
        }
        guard i + 2 < n, u[i] == 0x2F, u[i + 1] == 0x2F else { return nil }
        i += 2
        let hostStart = i
        while i < n && u[i] != 0x3A && u[i] != 0x2F {
            let b = u[i]
            // Percent-encoding and uppercase take the full path (it validates and lowercases them).
            guard ByteClass.isRegNameChar(b), b != 0x25, b &- 0x41 > 0x19 else { return nil }
            i += 1
        }
        let hostEnd = i
        guard hostEnd > hostStart else { return nil }
        var port = defaultPort
        if i < n && u[i] == 0x3A {
            i += 1
            let portStart = i
            var value = 0
            while i < n && u[i] != 0x2F {
                guard ByteClass.isDigit(u[i]), i - portStart < 5 else { return nil }
                value = value * 10 + Int(u[i] &- 0x30)
                i += 1
            }
            // An empty port, a leading zero, the scheme's own port or one out of range: the full path says.
            guard i > portStart, u[portStart] != 0x30, value <= 65535, value != defaultPort else { return nil }
            port = value
        }
        let authorityEnd = i
        guard i < n, u[i] == 0x2F else { return nil }
        for k in i..<n {
            guard ByteClass.isVisible(u[k]), u[k] != 0x23 else { return nil }
        }
        let host = String(decoding: UnsafeBufferPointer(rebasing: u[hostStart..<hostEnd]), as: UTF8.self)
        let hostHeader = port == defaultPort
            ? host : String(decoding: UnsafeBufferPointer(rebasing: u[hostStart..<authorityEnd]), as: UTF8.self)
        let path = String(decoding: UnsafeBufferPointer(rebasing: u[authorityEnd..<n]), as: UTF8.self)
        return RequestTarget(form: .absolute, scheme: scheme, host: host, port: UInt16(port), path: path,
                             hostHeaderValue: hostHeader, absoluteURL: spelled)
    }

    /// `parse` in full: every form, every check, the spelling rebuilt where it is not already the one.
    static func parseInFull(_ u: UnsafeBufferPointer<UInt8>, method: String, spelled: String?) -> Result<RequestTarget, HTTPWireError> {
        let n = u.count
        guard n > 0 else { return .failure(.malformed("empty request-target")) }
        for b in u {
            // RFC 9112 §3.2: the target is visible ASCII. Fragments are never sent (RFC 9110 §7.1); a '#'
            // means a broken client or an attempt to make proxy and origin disagree on the path.
            guard ByteClass.isVisible(b) else { return .failure(.malformed("invalid character in request-target")) }
            if b == 0x23 { return .failure(.malformed("fragment in request-target")) }
        }

        // RFC 9112 §3.2.3: CONNECT uses authority-form and nothing else; the port is required.
        if method == "CONNECT" {
            switch parseAuthority(u, 0, n, requirePort: true) {
            case .failure(let e): return .failure(e)
            case .success(let authority):
                let hostHeader = withPort(authority.bracketedHost, authority.port!)
                return .success(RequestTarget(
                    form: .authority, scheme: "", host: authority.host, port: authority.port!, path: "",
                    hostHeaderValue: hostHeader, absoluteURL: hostHeader
                ))
            }
        }

        if n == 1 && u[0] == 0x2A {
            // RFC 9112 §3.2.4: asterisk-form is only for a server-wide OPTIONS.
            guard method == "OPTIONS" else { return .failure(.malformed("asterisk-form request-target without OPTIONS")) }
            return .success(RequestTarget(form: .asterisk, scheme: "", host: "", port: 0, path: "*", hostHeaderValue: "", absoluteURL: "*"))
        }

        if u[0] == 0x2F {
            let path = String(decoding: u, as: UTF8.self)
            return .success(RequestTarget(form: .origin, scheme: "", host: "", port: 0, path: path, hostHeaderValue: "", absoluteURL: path))
        }

        // absolute-form: scheme "://" authority path-abempty [ "?" query ] (RFC 3986 §3, §4.3).
        var i = 0
        while i < n && (ByteClass.isAlpha(u[i]) || (i > 0 && (ByteClass.isDigit(u[i]) || u[i] == 0x2B || u[i] == 0x2D || u[i] == 0x2E))) {
            i += 1
        }
        guard i > 0, i + 2 < n, u[i] == 0x3A, u[i + 1] == 0x2F, u[i + 2] == 0x2F else {
            return .failure(.malformed("request-target is not origin-, absolute-, authority- or asterisk-form"))
        }
        let scheme: String
        let defaultPort: UInt16
        if equalsLower(u, 0, i, "http") {
            scheme = "http"; defaultPort = 80
        } else if equalsLower(u, 0, i, "https") {
            scheme = "https"; defaultPort = 443
        } else {
            return .failure(.malformed("unsupported scheme"))
        }
        let authorityStart = i + 3
        var authorityEnd = authorityStart
        while authorityEnd < n && u[authorityEnd] != 0x2F && u[authorityEnd] != 0x3F { authorityEnd += 1 }

        let authority: Authority
        switch parseAuthority(u, authorityStart, authorityEnd, requirePort: false) {
        case .failure(let e): return .failure(e)
        case .success(let a): authority = a
        }
        let port = authority.port ?? defaultPort

        // RFC 9112 §3.2.1: an empty path is sent as "/".
        var path: String
        if authorityEnd == n {
            path = "/"
        } else if u[authorityEnd] == 0x3F {
            path = joined("/", String(decoding: UnsafeBufferPointer(rebasing: u[authorityEnd..<n]), as: UTF8.self))
        } else {
            path = String(decoding: UnsafeBufferPointer(rebasing: u[authorityEnd..<n]), as: UTF8.self)
        }
        let hostHeader = port == defaultPort ? authority.bracketedHost : withPort(authority.bracketedHost, port)
        let absoluteURL: String
        if let spelled, authorityEnd < n, u[authorityEnd] == 0x2F, bytesEqual(u, 0, scheme),
           bytesEqual(u, authorityStart, hostHeader), authorityEnd - authorityStart == hostHeader.utf8.count {
            absoluteURL = spelled
        } else {
            absoluteURL = joined(scheme, "://", hostHeader, path)
        }
        return .success(RequestTarget(
            form: .absolute, scheme: scheme, host: authority.host, port: port, path: path,
            hostHeaderValue: hostHeader, absoluteURL: absoluteURL
        ))
    }

    /// Whether `u` holds exactly `part`'s bytes from `start` on (it may go on after them).
    private static func bytesEqual(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ part: String) -> Bool {
        part.withUTF8Bytes { p in
            guard start + p.count <= u.count else { return false }
            for k in 0..<p.count where u[start + k] != p[k] { return false }
            return true
        }
    }

    /// `host:port`, the port in decimal: `String(port)` went through `description` (~250 instructions).
    private static func withPort(_ host: String, _ port: UInt16) -> String {
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0)
        var value = Int(port)
        var count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            repeat {
                d[4 - count] = 0x30 + UInt8(value % 10)
                value /= 10
                count += 1
            } while value > 0
        }
        let hostCount = host.utf8.count
        return String(unsafeUninitializedCapacity: hostCount + 1 + count) { out in
            host.withUTF8Bytes { h in
                if let base = h.baseAddress, h.count > 0 { out.baseAddress!.initialize(from: base, count: h.count) }
            }
            out[hostCount] = 0x3A
            withUnsafeBytes(of: digits) { d in
                for k in 0..<count { out[hostCount + 1 + k] = d[5 - count + k] }
            }
            return hostCount + 1 + count
        }
    }

    /// An origin-form target (`/path?query`) made absolute for `http://`, with `host` (a `Host` field value) as its
    /// authority: what `parse("http://" + host + origin.path)` gives when that parse keeps the path as it was, and
    /// nil when it would not (a `Host` that is no authority, or that would move the path, such as `a/b`). Only the
    /// host is read, once: the path was checked when `origin` was parsed. `host` is read as `parse` reads an
    /// authority (no userinfo, reg-name characters or an IPv6 literal, a port of 1–65535 or none).
    public static func httpOnHost(_ host: String, origin: RequestTarget) -> RequestTarget? {
        guard origin.form == .origin else { return nil }
        let parsed: Result<Authority, HTTPWireError> = host.withUTF8Bytes { u in
            // The authority ends at the first "/" or "?" in `parse`; such a Host would move the path.
            for b in u where b == 0x2F || b == 0x3F || b == 0x23 || !ByteClass.isVisible(b) {
                return .failure(.malformed("invalid character in host"))
            }
            return parseAuthority(u, 0, u.count, requirePort: false)
        }
        guard case .success(let authority) = parsed else { return nil }
        let port = authority.port ?? 80
        let hostHeader = port == 80 ? authority.bracketedHost : withPort(authority.bracketedHost, port)
        return RequestTarget(form: .absolute, scheme: "http", host: authority.host, port: port, path: origin.path,
                             hostHeaderValue: hostHeader, absoluteURL: joined("http://", hostHeader, origin.path))
    }

    /// Whether `parse(scheme + "://" + authority + path)` gives an absolute-form target whose path is `path`: an
    /// HTTP/2 request's `:scheme`, `:authority` and `:path` (RFC 9113 §8.3.1), which arrive apart, held to the
    /// absolute form's grammar without the joined string or the target being built (`HTTP2RequestBuilder`, on
    /// every h2 request). Read as `parse` reads them: visible ASCII and no fragment anywhere; an authority with no
    /// "/" or "?" (the joined URL's authority would end there and the path move) read by `parseAuthority`; a path
    /// that starts with "/". `RequestTargetPartsDifferentialTests` and the fuzz target hold it to the reference.
    public static func isAbsolute(scheme: String, authority: String, path: String) -> Bool {
        let knownScheme = scheme.withUTF8Bytes { u in
            equalsLower(u, 0, u.count, "http") || equalsLower(u, 0, u.count, "https")
        }
        guard knownScheme else { return false }
        let pathIsValid = path.withUTF8Bytes { u in
            guard u.first == 0x2F else { return false }
            for b in u where b == 0x23 || !ByteClass.isVisible(b) { return false }
            return true
        }
        guard pathIsValid else { return false }
        return authority.withUTF8Bytes { u in
            for b in u where b == 0x2F || b == 0x3F || b == 0x23 || !ByteClass.isVisible(b) { return false }
            if case .success = parseAuthority(u, 0, u.count, requirePort: false) { return true }
            return false
        }
    }

    struct Authority {
        var host: String
        var bracketedHost: String
        var port: UInt16?
    }

    /// `authority = host [ ":" port ]` without userinfo (RFC 9110 §4.2.4 forbids it in http(s) URIs;
    /// RFC 9112 §3.2.3 in CONNECT). host = IP-literal / IPv4address / reg-name (RFC 3986 §3.2.2).
    static func parseAuthority(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, requirePort: Bool) -> Result<Authority, HTTPWireError> {
        for k in start..<end where u[k] == 0x40 {
            return .failure(.malformed("userinfo in request-target"))
        }
        guard end > start else { return .failure(.malformed("empty host")) }
        var i = start
        let host: String
        let bracketed: String
        if u[i] == 0x5B {
            // IP-literal: "[" IPv6address "]". IPvFuture and zone identifiers are not accepted.
            var close = i + 1
            while close < end && u[close] != 0x5D { close += 1 }
            guard close < end, isIPv6(u, i + 1, close) else { return .failure(.malformed("invalid IPv6 address")) }
            host = lowercasedString(u, i + 1, close)
            bracketed = joined("[", host, "]")
            i = close + 1
        } else {
            while i < end && u[i] != 0x3A {
                let b = u[i]
                if b == 0x25 {
                    // pct-encoded = "%" HEXDIG HEXDIG
                    guard i + 2 < end, ByteClass.hexValue(u[i + 1]) != nil, ByteClass.hexValue(u[i + 2]) != nil else {
                        return .failure(.malformed("invalid percent-encoding in host"))
                    }
                    i += 3
                    continue
                }
                guard ByteClass.isRegNameChar(b) else { return .failure(.malformed("invalid character in host")) }
                i += 1
            }
            guard i > start else { return .failure(.malformed("empty host")) }
            host = lowercasedString(u, start, i)
            bracketed = host
        }
        var port: UInt16?
        if i < end {
            guard u[i] == 0x3A else { return .failure(.malformed("invalid character after host")) }
            i += 1
            if i == end {
                // RFC 3986 §3.2.3: an empty port means the scheme default; authority-form has no default.
                if requirePort { return .failure(.malformed("missing port")) }
            } else {
                guard end - i <= 5 else { return .failure(.malformed("invalid port")) }
                var v = 0
                while i < end {
                    guard ByteClass.isDigit(u[i]) else { return .failure(.malformed("invalid port")) }
                    v = v * 10 + Int(u[i] &- 0x30)
                    i += 1
                }
                guard v >= 1 && v <= 65535 else { return .failure(.malformed("invalid port")) }
                port = UInt16(v)
            }
        } else if requirePort {
            return .failure(.malformed("missing port"))
        }
        return .success(Authority(host: host, bracketedHost: bracketed, port: port))
    }

    /// RFC 3986 §3.2.2 IPv6address: eight 16-bit groups of 1–4 HEXDIG, at most one "::" standing for one or more
    /// zero groups, and optionally a dotted IPv4 address as the last 32 bits.
    static func isIPv6(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> Bool {
        guard end - start >= 2 else { return false }
        var doubleColon = -1
        var i = start
        while i + 1 < end {
            if u[i] == 0x3A && u[i + 1] == 0x3A {
                if doubleColon >= 0 { return false }
                doubleColon = i
                i += 2
            } else {
                i += 1
            }
        }
        if doubleColon >= 0 {
            guard let left = groups(u, start, doubleColon, last: false),
                  let right = groups(u, doubleColon + 2, end, last: true) else { return false }
            return left + right <= 7
        }
        return groups(u, start, end, last: true) == 8
    }

    /// Number of 16-bit groups in a ':'-separated run, or nil if malformed. An IPv4 tail counts as two.
    private static func groups(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, last: Bool) -> Int? {
        if start == end { return 0 }
        var count = 0
        var s = start
        while true {
            var e = s
            var dots = false
            while e < end && u[e] != 0x3A {
                if u[e] == 0x2E { dots = true }
                e += 1
            }
            if e == s { return nil }
            if dots {
                guard last, e == end, isIPv4(u, s, e) else { return nil }
                count += 2
            } else {
                guard e - s <= 4 else { return nil }
                for k in s..<e where ByteClass.hexValue(u[k]) == nil { return nil }
                count += 1
            }
            if count > 8 { return nil }
            if e == end { return count }
            s = e + 1
            if s == end { return nil }
        }
    }

    /// Dotted-decimal IPv4 with dec-octets 0–255 and no leading zeros (RFC 3986 §3.2.2), so that `010` is never
    /// read as octal by one side and decimal by the other.
    static func isIPv4(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> Bool {
        var octets = 0
        var i = start
        while true {
            let s = i
            var v = 0
            while i < end && ByteClass.isDigit(u[i]) && i - s < 3 {
                v = v * 10 + Int(u[i] &- 0x30)
                i += 1
            }
            let len = i - s
            guard len > 0, v <= 255, !(len > 1 && u[s] == 0x30) else { return false }
            octets += 1
            if i == end { return octets == 4 }
            guard u[i] == 0x2E, octets < 4 else { return false }
            i += 1
        }
    }

    /// Concatenation with one allocation (chained `+` allocates an intermediate String per step), the parts copied
    /// as bytes: `String.append` costs ~250 instructions a part (callgrind).
    private static func joined(_ a: String, _ b: String, _ c: String = "", _ d: String = "") -> String {
        let count = a.utf8.count + b.utf8.count + c.utf8.count + d.utf8.count
        return String(unsafeUninitializedCapacity: count) { out in
            var at = 0
            func copy(_ part: String) {
                part.withUTF8Bytes { src in
                    guard let base = src.baseAddress, src.count > 0 else { return }
                    (out.baseAddress! + at).initialize(from: base, count: src.count)
                    at += src.count
                }
            }
            copy(a)
            copy(b)
            copy(c)
            copy(d)
            return at
        }
    }

    private static func equalsLower(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int, _ word: StaticString) -> Bool {
        guard end - start == word.utf8CodeUnitCount else { return false }
        let w = word.utf8Start
        for k in 0..<(end - start) where ByteClass.lower(u[start + k]) != w[k] { return false }
        return true
    }

    private static func lowercasedString(_ u: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> String {
        String(unsafeUninitializedCapacity: end - start) { out in
            for k in 0..<(end - start) { out[k] = ByteClass.lower(u[start + k]) }
            return end - start
        }
    }
}
