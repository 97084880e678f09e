/// Builds request bytes for the raw client: what a well-behaved proxy client (curl -x) would send, so a test
/// only spells out what it is about.
public enum RequestText {
    /// `method url version`, then `Host` (the URL's authority unless `host` is given; `""` = none), the
    /// `headers` in order, `Content-Length` when a `body` is given (unless `headers` already frame it),
    /// the empty line and the body.
    public static func make(_ method: String = "GET", _ url: String, headers: [(String, String)] = [],
                            body: String? = nil, host: String? = nil, version: String = "HTTP/1.1") -> String {
        var text = "\(method) \(url) \(version)\r\n"
        let hostValue = host ?? authority(of: url)
        if !hostValue.isEmpty { text += "Host: \(hostValue)\r\n" }
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        let framed = headers.contains { ["content-length", "transfer-encoding"].contains($0.0.lowercased()) }
        if let body, !framed { text += "Content-Length: \(body.utf8.count)\r\n" }
        text += "\r\n"
        if let body { text += body }
        return text
    }

    /// The authority of an absolute URL (`http://host:port/path` -> `host:port`); the whole string otherwise.
    public static func authority(of url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? rest.endIndex
        return String(rest[..<end])
    }
}
