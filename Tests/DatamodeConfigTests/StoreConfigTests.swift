import DatamodeConfig
import Testing

/// SPEC §19 `store`: the kind, the Redis URL, prefix and password file, and the errors that name them.
@Suite("Store configuration")
struct StoreConfigTests {
    @Test("the default is the state directory, in the defaults, an empty section and the shipped file")
    func defaults() throws {
        #expect(ProxyConfiguration.defaults.store == StoreSection())
        #expect(try parse("").store.kind == .file)
        #expect(try parse("store: {}\n").store == StoreSection())
        let shipped = try ProxyConfiguration.load(path: shippedConfigPath).store
        #expect(shipped.kind == .file && shipped.redis.url == "redis://127.0.0.1:6379/0" && shipped.redis.keyPrefix == "datamode:")
    }

    @Test("a Redis store: host, port and database from the URL, the prefix, the password file made absolute")
    func redis() throws {
        let store = try parse("""
            store:
              kind: redis
              redis: {url: "redis://redis.fleet.svc:6380/2", key-prefix: "ships:", password-file: secrets/redis}
            """).store
        #expect(store.kind == .redis)
        #expect(store.redis.host == "redis.fleet.svc" && store.redis.port == 6380 && store.redis.database == 2)
        #expect(store.redis.keyPrefix == "ships:")
        #expect(store.redis.passwordFile?.hasPrefix("/") == true && store.redis.passwordFile?.hasSuffix("/secrets/redis") == true)
        let v6 = try parse("store: {kind: redis, redis: {url: \"redis://[::1]\"}}").store.redis
        #expect(v6.host == "::1" && v6.port == 6379 && v6.database == 0)
    }

    @Test("bad store values name their key and line", arguments: [
        ErrorCase("store:\n  kind: etcd", key: "store.kind", line: 2, "expected file or redis"),
        ErrorCase("store:\n  redis: {url: \"http://127.0.0.1:6379\"}", key: "store.redis.url", line: 2, "redis://"),
        ErrorCase("store:\n  redis: {url: \"redis://:hunter2@127.0.0.1:6379/0\"}", key: "store.redis.url", line: 2, "password-file"),
        ErrorCase("store:\n  redis: {url: \"redis://127.0.0.1:0/0\"}", key: "store.redis.url", line: 2, "from 1 to 65535"),
        ErrorCase("store:\n  redis: {url: \"redis://127.0.0.1:6379/x\"}", key: "store.redis.url", line: 2, "database number"),
        ErrorCase("store:\n  redis: {url: \"redis://\"}", key: "store.redis.url", line: 2, "a host"),
        ErrorCase("store:\n  redis: {key-prefix: \"a b\"}", key: "store.redis.key-prefix", line: 2, "without spaces"),
        ErrorCase("store:\n  redis: {key-prefix: \"\"}", key: "store.redis.key-prefix", line: 2, "key prefix"),
        ErrorCase("store:\n  redis: {password: x}", key: "store.redis.password", line: 2, "unknown key"),
        ErrorCase("store:\n  backend: redis", key: "store.backend", line: 2, "unknown key"),
        ErrorCase("store: redis", key: "store", line: 1, "expected a mapping"),
    ])
    func errors(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}
