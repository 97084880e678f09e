/// Where the state shared by many proxies lives (SPEC §19). Read once at start-up: a reload that changes it is
/// warned about and takes effect at the next start (a proxy does not move its state between stores while running).
public struct StoreSection: Sendable, Equatable {
    public enum Kind: String, Sendable, Equatable, CaseIterable {
        /// The state directory, watched for what another process writes there (default; nothing to install).
        case file
        /// Redis: mode, variants and conditions shared by every proxy with the same URL and key prefix.
        case redis
    }

    public var kind: Kind = .file
    public var redis: RedisStoreSettings = RedisStoreSettings()

    public init() {}
}

/// `store.redis` (SPEC §19).
public struct RedisStoreSettings: Sendable, Equatable {
    /// `url`, as written (never holds a password: one in the URL is refused).
    public var url: String = "redis://127.0.0.1:6379/0"
    public var host: String = "127.0.0.1"
    public var port: Int = 6379
    public var database: Int = 0
    /// `key-prefix`: every key and the change channel start with it. Default `datamode:`.
    public var keyPrefix: String = "datamode:"
    /// `password-file`: read at start-up (trailing newline dropped); never logged. Absolute once parsed.
    public var passwordFile: String?

    public init() {}

    /// The databases a stock Redis has (`databases 16`); a configured Redis may have more, so up to 2^20.
    public static let maximumDatabase = 1 << 20

    /// What a URL that is not one should have been.
    struct URLProblem: Error {
        var expected: String
    }

    /// Parses `redis://host[:port][/db]`, or says what it should have been.
    static func parse(url: String) -> Result<(host: String, port: Int, database: Int), URLProblem> {
        guard url.hasPrefix("redis://") else { return .failure(URLProblem(expected: "a URL that starts with redis://")) }
        var rest = Substring(url.dropFirst("redis://".count))
        if rest.contains("@") {
            return .failure(URLProblem(expected: "a URL without credentials (put the password in store.redis.password-file, so it stays out of the config file and the logs)"))
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let path = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
            if !path.isEmpty {
                guard path.allSatisfy({ $0.isASCII && $0.isNumber }), path.count <= 7, let number = Int(path),
                      number <= maximumDatabase else {
                    return .failure(URLProblem(expected: "a database number after the host (redis://host:6379/0)"))
                }
                database = number
            }
        }
        var host: Substring
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return .failure(URLProblem(expected: "an IPv6 host in brackets, e.g. redis://[::1]:6379/0")) }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return .failure(URLProblem(expected: "a port after the bracketed host")) }
                portText = after.dropFirst()
            }
        } else if let colon = rest.firstIndex(of: ":") {
            host = rest[..<colon]
            portText = rest[rest.index(after: colon)...]
        } else {
            host = rest
        }
        guard !host.isEmpty, host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || ".-_:".contains($0)) }) else {
            return .failure(URLProblem(expected: "a host name or address after redis://"))
        }
        var port = 6379
        if let portText {
            guard portText.allSatisfy({ $0.isASCII && $0.isNumber }), portText.count <= 5, let number = Int(portText),
                  (1...65_535).contains(number) else {
                return .failure(URLProblem(expected: "a port from 1 to 65535"))
            }
            port = number
        }
        return .success((String(host), port, database))
    }
}

extension ConfigParser {
    static let storeKeys = ["kind", "redis"]
    static let redisStoreKeys = ["url", "key-prefix", "password-file"]

    /// `store: {kind: file|redis, redis: {url, key-prefix, password-file}}` (SPEC §19).
    func store(_ node: ConfigNode) throws(ConfigError) -> StoreSection {
        let section = try node.section(known: Self.storeKeys)
        var store = StoreSection()
        if let value = section["kind"] {
            let text = try value.string()
            guard let kind = StoreSection.Kind(rawValue: text) else {
                throw value.expected("file or redis")
            }
            store.kind = kind
        }
        if let value = section["redis"] {
            let redis = try value.section(known: Self.redisStoreKeys)
            if let url = redis["url"] {
                let text = try url.nonEmptyString("a Redis URL such as redis://127.0.0.1:6379/0")
                switch RedisStoreSettings.parse(url: text) {
                case .success(let parsed):
                    store.redis.url = text
                    (store.redis.host, store.redis.port, store.redis.database) = parsed
                case .failure(let problem):
                    throw url.expected(problem.expected)
                }
            }
            if let prefix = redis["key-prefix"] {
                let text = try prefix.nonEmptyString("a key prefix such as datamode:")
                guard text.utf8.count <= 128, text.allSatisfy({ $0.isASCII && !$0.isWhitespace && !$0.isNewline }) else {
                    throw prefix.expected("a key prefix of at most 128 printable ASCII characters without spaces")
                }
                store.redis.keyPrefix = text
            }
            if let file = redis["password-file"], !file.isNull {
                let written = try file.nonEmptyString("a path to a file holding the Redis password")
                store.redis.passwordFile = ProxyConfiguration.absolutePath(written.hasPrefix("/") ? written : baseDirectory + "/" + written)
            }
        }
        return store
    }
}
