import DatamodePolicy

/// Request facts for an absolute `http(s)://host[:port]/path?query` URL, the way the engine builds them.
func request(_ url: String, method: String = "GET", fields: [(String, String)] = [], client: String? = "127.0.0.1")
    -> RequestFacts
{
    let schemeEnd = url.firstRange(of: "://")!
    let scheme = String(url[..<schemeEnd.lowerBound])
    let afterScheme = url[schemeEnd.upperBound...]
    let authorityEnd = afterScheme.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? afterScheme.endIndex
    let authority = afterScheme[..<authorityEnd]
    var host = String(authority)
    var port = scheme == "https" ? 443 : 80
    if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
        host = String(authority[authority.index(after: authority.startIndex)..<close])
        let rest = authority[authority.index(after: close)...]
        if rest.hasPrefix(":") { port = Int(rest.dropFirst())! }
    } else if let colon = authority.lastIndex(of: ":") {
        host = String(authority[..<colon])
        port = Int(authority[authority.index(after: colon)...])!
    }
    return RequestFacts(method: method, url: url, host: host, port: port, path: String(afterScheme[authorityEnd...]),
                        isConnect: false, client: client.flatMap { IPAddress($0) },
                        fields: fields.map { (name: $0.0, value: $0.1) })
}

/// Request facts for `CONNECT host:port`.
func connect(_ target: String, fields: [(String, String)] = [], client: String? = "127.0.0.1") -> RequestFacts {
    let colon = target.lastIndex(of: ":")!
    return RequestFacts(method: "CONNECT", url: target, host: String(target[..<colon]),
                        port: Int(target[target.index(after: colon)...])!, path: "", isConnect: true,
                        client: client.flatMap { IPAddress($0) }, fields: fields.map { (name: $0.0, value: $0.1) })
}

func policy(tags: TagSettings = TagSettings(), rules: [Rule] = [], variants: [Variant] = []) -> PolicySnapshot {
    do {
        return try PolicySnapshot(tags: tags, rules: rules, variants: variants)
    } catch {
        fatalError("test policy does not compile: \(error)")
    }
}

func tags(_ c: Bool, _ e: Bool) -> RequestTags { RequestTags(allowConstrained: c, allowExpensive: e) }

let normal = DataMode.normal
let constrained = DataMode(constrained: true, expensive: false)
let expensive = DataMode(constrained: false, expensive: true)
let both = DataMode(constrained: true, expensive: true)
let allModes = [normal, constrained, expensive, both]

/// Which tag a table row is about, so one table checks both tags separately (SPEC §3 "each separately").
enum Tag: String, CaseIterable, Sendable, CustomStringConvertible {
    case constrained, expensive
    var header: String { self == .constrained ? "Allow-Constrained" : "Allow-Expensive" }
    var other: Tag { self == .constrained ? .expensive : .constrained }
    var description: String { rawValue }
    func assignment(_ value: Bool) -> TagAssignment {
        self == .constrained ? TagAssignment(allowConstrained: value) : TagAssignment(allowExpensive: value)
    }
    func value(of t: RequestTags) -> Bool { self == .constrained ? t.allowConstrained : t.allowExpensive }
    func defaults(_ value: Bool) -> RequestTags {
        self == .constrained ? RequestTags(allowConstrained: value, allowExpensive: true)
            : RequestTags(allowConstrained: true, allowExpensive: value)
    }
}

extension Decision {
    var rewrite: VariantRewrite? {
        if case .serveVariant(_, let r) = self { return r }
        return nil
    }
    var rejection: Rejection? {
        if case .reject(_, let r) = self { return r }
        return nil
    }
    var isForward: Bool {
        if case .forward = self { return true }
        return false
    }
    var invalidTagDetail: String? {
        if case .invalidTag(let d) = self { return d }
        return nil
    }
}

/// The eight modes of SPEC §15, in the order of its names (`allModes` above is the first four).
let everyMode = DataMode.canonicalNames.map { DataMode(name: $0)! }
let satellite = DataMode(constrained: true, expensive: true, ultraConstrained: true)
