import DatamodePolicy

/// Deferral (SPEC §18): how long a refused request may be held, and which refused uploads are stored and
/// delivered later, within which bounds.
public struct DeferralSection: Sendable, Equatable {
    /// `max-hold`: the longest a request is held (`Prefer: wait=N` or a rule's `hold`, whichever is shorter).
    /// Default 30 s.
    public var maxHold: Duration
    /// `max-held`: requests held at once; one more is refused at once. 0 = nothing is held. Default 1000.
    public var maxHeld: Int
    /// `uploads`: absolute-URL globs whose refused `POST`/`PUT`/`PATCH` are stored and forwarded later even without
    /// `Prefer: respond-async`. Case-sensitive (paths are, RFC 3986 §6.2.2.1), matched against the request's
    /// canonical URL, whose scheme and host are lowercase; so the scheme and host of a pattern are lowercased
    /// when it is read. Default none.
    public var uploads: [Glob]
    /// `max-body`: the largest upload stored, in bytes; a larger one gets the refusal it would have had.
    /// Default 64 MiB.
    public var maxBody: Int
    /// `max-bytes`: every stored upload together (bodies of entries not delivered yet); beyond it an upload is
    /// refused with `"deferral": "full"`. Default 1 GiB.
    public var maxBytes: UInt64
    /// `max-age`: a stored upload not delivered by then ends as `expired`. Default 7 days.
    public var maxAge: Duration
    /// `concurrency`: deliveries at once per origin. Default 2.
    public var concurrency: Int

    public init(maxHold: Duration = .seconds(30), maxHeld: Int = 1000, uploads: [Glob] = [], maxBody: Int = 64 << 20,
                maxBytes: UInt64 = 1 << 30, maxAge: Duration = .seconds(7 * 86_400), concurrency: Int = 2) {
        self.maxHold = maxHold
        self.maxHeld = maxHeld
        self.uploads = uploads
        self.maxBody = maxBody
        self.maxBytes = maxBytes
        self.maxAge = maxAge
        self.concurrency = concurrency
    }

    /// Whether a refused upload to `url` (the canonical absolute URL: lowercase scheme and host) is stored without
    /// `Prefer: respond-async`.
    public func storesUpload(url: String) -> Bool {
        uploads.contains { $0.matches(url) }
    }

    /// The largest `max-body`: the engine holds a body whole in memory while it reads and stores it, and the store
    /// keeps it as one SQLite value, which cannot exceed 1,000,000,000 bytes (SQLITE_MAX_LENGTH).
    public static let maximumBody = 512 << 20
    /// The longest `max-age`: an upload older than a year is not deferred, it is lost in a drawer.
    public static let maximumAge: Duration = .seconds(366 * 86_400)
    /// The most deliveries at once per origin: more is a crowd, not a queue.
    public static let maximumConcurrency = 64
    /// The most requests held at once: each is an open client connection with its head in memory.
    public static let maximumHeld = 100_000
}

extension ConfigValue {
    /// A retention period (`max-age`): `ms`, `s`, `m`, `h` or `d` (86,400 s), or a bare integer of seconds;
    /// positive and at most `DeferralSection.maximumAge`. Unlike `duration`, days are allowed: this is how long
    /// something is kept, not a timer.
    static func retention(_ text: String) -> Duration? {
        let trimmed = text.trimmingCharacters(in: " ")
        let digits = trimmed.prefix { $0.isASCII && $0.isNumber }
        let unit = trimmed.dropFirst(digits.count).trimmingCharacters(in: " ")
        guard !digits.isEmpty, digits.count <= 12, let value = Int64(digits) else { return nil }
        let duration: Duration
        switch unit {
        case "ms": duration = .milliseconds(value)
        case "", "s": duration = .seconds(value)
        case "m", "min": duration = .seconds(value * 60)
        case "h": duration = .seconds(value * 3600)
        case "d": duration = .seconds(value * 86_400)
        default: return nil
        }
        guard duration > .zero, duration <= DeferralSection.maximumAge else { return nil }
        return duration
    }
}

extension ConfigParser {
    static let deferralKeys = ["max-hold", "max-held", "uploads", "max-body", "max-bytes", "max-age", "concurrency"]

    /// `deferral: {max-hold, max-held, uploads, max-body, max-bytes, max-age, concurrency}` (SPEC §18).
    func deferral(_ node: ConfigNode) throws(ConfigError) -> DeferralSection {
        let section = try node.section(known: Self.deferralKeys)
        var deferral = DeferralSection()
        if let value = section["max-hold"] { deferral.maxHold = try value.duration() }
        if let value = section["max-held"] {
            deferral.maxHeld = try value.integer(in: 0...DeferralSection.maximumHeld,
                                                 what: "a number of requests held at once (0 = none)")
        }
        if let value = section["uploads"] { deferral.uploads = try uploadGlobs(value) }
        if let value = section["max-body"] {
            let bytes = try deferralSize(value, what: "a positive size such as 64MiB or 10MB")
            guard bytes <= UInt64(DeferralSection.maximumBody) else {
                throw value.error("expected a size of at most \(describeSize(DeferralSection.maximumBody)) (a body is "
                    + "held in memory whole and stored as one value), got \(value.describe)")
            }
            deferral.maxBody = Int(bytes)
        }
        if let value = section["max-bytes"] {
            deferral.maxBytes = try deferralSize(value, what: "a positive size such as 1GiB or 500MB")
        }
        if UInt64(deferral.maxBody) > deferral.maxBytes {
            // The key the file set is the one to fix; both set: max-bytes, the total that cannot hold one upload.
            let culprit = section["max-bytes"] ?? section["max-body"]!
            throw culprit.error("max-bytes (\(deferral.maxBytes) bytes) is smaller than max-body (\(deferral.maxBody) "
                + "bytes): the largest upload accepted could never be stored")
        }
        if let value = section["max-age"] {
            guard case .scalar(let scalar) = value.node, !value.isNull, let age = ConfigValue.retention(scalar.string) else {
                throw value.expected("a duration such as 7d, 12h or 30m (positive, at most 366d)")
            }
            deferral.maxAge = age
        }
        if let value = section["concurrency"] {
            deferral.concurrency = try value.integer(in: 1...DeferralSection.maximumConcurrency,
                                                     what: "a number of deliveries at once per origin")
        }
        return deferral
    }

    /// A positive byte count in the units of SPEC §8 (`64MiB`, `1GiB`, `500MB`).
    private func deferralSize(_ node: ConfigNode, what: String) throws(ConfigError) -> UInt64 {
        guard case .scalar(let scalar) = node.node, !node.isNull, let bytes = ConfigValue.byteCount(scalar.string),
              bytes > 0 else {
            throw node.expected(what)
        }
        return bytes
    }

    /// `uploads`: a list of absolute-URL globs (`https://api.example/upload/*`) or globs starting with `*`; no
    /// whitespace or control characters (they could never match a request's URL). The scheme and host are
    /// lowercased, like the URLs they are matched against.
    private func uploadGlobs(_ node: ConfigNode) throws(ConfigError) -> [Glob] {
        var globs: [Glob] = []
        for item in try node.sequence("a list of URL globs such as [\"https://api.example/upload/*\"]") {
            let text = try item.nonEmptyString("a URL glob such as https://api.example/upload/*")
            guard text.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }) else {
                throw item.expected("a URL glob of visible ASCII characters without spaces (percent-encode the rest)")
            }
            guard let pattern = Self.lowercasingSchemeAndHost(text) else {
                throw item.expected("a URL glob starting with http://, https:// or * (such as https://api.example/upload/*)")
            }
            globs.append(Glob(pattern, caseInsensitive: false))
        }
        return globs
    }

    /// `HTTPS://API.Example/Upload/*` → `https://api.example/Upload/*`; a pattern starting with `*` as it is;
    /// `nil` for anything that is neither.
    static func lowercasingSchemeAndHost(_ text: String) -> String? {
        if text.hasPrefix("*") { return text }
        let lowered = text.lowercased()
        let scheme: String
        if lowered.hasPrefix("http://") {
            scheme = "http://"
        } else if lowered.hasPrefix("https://") {
            scheme = "https://"
        } else {
            return nil
        }
        let rest = text.dropFirst(scheme.count)
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        guard authorityEnd > rest.startIndex else { return nil }
        return scheme + rest[..<authorityEnd].lowercased() + rest[authorityEnd...]
    }
}
