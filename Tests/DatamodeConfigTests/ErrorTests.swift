import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

@Suite("Bad values")
struct BadValueTests {
    static let badValues: [ErrorCase] = [
        // listen / admin
        ErrorCase("listen: localhost:8877", key: "listen", line: 1, #"expected an IP address and port such as 127.0.0.1:8877 or [::1]:8877, got "localhost:8877""#),
        ErrorCase("listen: 127.0.0.1", key: "listen", line: 1, "expected an IP address and port"),
        ErrorCase("listen: 127.0.0.1:70000", key: "listen", line: 1, "expected an IP address and port"),
        ErrorCase("listen: \"::1:8877\"", key: "listen", line: 1, "expected an IP address and port"),
        ErrorCase("listen: [127.0.0.1, 8877]", key: "listen", line: 1, "got a list"),
        ErrorCase("listen:", key: "listen", line: 1, "got nothing (null)"),
        ErrorCase("admin:\n  listen: nope", key: "admin.listen", line: 2, #"got "nope""#),
        ErrorCase("admin:\n  token: \"\"", key: "admin.token", line: 2, "expected a token"),
        ErrorCase("admin:\n  token: has space", key: "admin.token", line: 2, "expected a token"),
        ErrorCase("admin: 127.0.0.1:8878", key: "admin", line: 1, "expected a mapping"),
        // mode
        ErrorCase("mode: turbo", key: "mode", line: 1,
                  "expected a data mode (normal, constrained, expensive, constrained-expensive, ultra-constrained, "
                      + "constrained-ultra-constrained, expensive-ultra-constrained, constrained-expensive-ultra-constrained, "
                      + #"low-data, cellular, satellite), got "turbo""#),
        ErrorCase("\n\nmode: [normal]", key: "mode", line: 3, "got a list"),
        // state-dir, threads
        ErrorCase("state-dir: \"\"", key: "state-dir", line: 1, "expected a directory path"),
        ErrorCase("threads: -1", key: "threads", line: 1, "from 0 to 256, got -1"),
        ErrorCase("threads: 1000", key: "threads", line: 1, "from 0 to 256, got 1000"),
        ErrorCase("threads: four", key: "threads", line: 1, #"got "four""#),
        ErrorCase("threads: 1.5", key: "threads", line: 1, #"got "1.5""#),
        ErrorCase("threads: 0x10", key: "threads", line: 1, #"got "0x10""#),
        // booleans: YAML true/false only
        ErrorCase("tags:\n  forward: yes", key: "tags.forward", line: 2, #"expected true or false, got "yes""#),
        ErrorCase("tags:\n  save-data: on", key: "tags.save-data", line: 2, #"expected true or false, got "on""#),
        ErrorCase("tags:\n  prefetch-is-discretionary: 1", key: "tags.prefetch-is-discretionary", line: 2, "expected true or false"),
        ErrorCase("tags:\n  forward: \"true\"", key: "tags.forward", line: 2, "expected true or false"),
        ErrorCase("tags:\n  defaults:\n    allow-expensive: nope", key: "tags.defaults.allow-expensive", line: 3, "expected true or false"),
        ErrorCase("tags:\n  defaults: true", key: "tags.defaults", line: 2, "expected a mapping"),
        ErrorCase("tags: on", key: "tags", line: 1, #"expected a mapping, got "on""#),
        // connect
        ErrorCase("connect:\n  ports: [443, 0]", key: "connect.ports[1]", line: 2, "from 1 to 65535, got 0"),
        ErrorCase("connect:\n  ports:\n    - 443\n    - 70000", key: "connect.ports[1]", line: 4, "from 1 to 65535, got 70000"),
        ErrorCase("connect:\n  ports: 443", key: "connect.ports", line: 2, "expected a list of ports"),
        ErrorCase("connect:\n  ports: [https]", key: "connect.ports[0]", line: 2, #"expected a port number, got "https""#),
        // access
        ErrorCase("access:\n  allow: [10.0.0.0/33]", key: "access.allow[0]", line: 2, "expected a CIDR block"),
        ErrorCase("access:\n  allow:\n    - 127.0.0.0/8\n    - nonsense", key: "access.allow[1]", line: 4, #"got "nonsense""#),
        ErrorCase("access:\n  allow: 127.0.0.0/8", key: "access.allow", line: 2, "expected a list of CIDR blocks"),
        ErrorCase("access:\n  users:\n    \"a:b\": pw", key: "access.users.a:b", line: 3, "without ':'"),
        ErrorCase("access:\n  users: [alice]", key: "access.users", line: 2, "expected a mapping of user name to password"),
        ErrorCase("access:\n  users:\n    alice:", key: "access.users.alice", line: 3, "expected a string, got nothing"),
        ErrorCase("access:\n  users:\n    alice: [a]", key: "access.users.alice", line: 3, "got a list"),
        // limits
        ErrorCase("limits:\n  request-line: 8KB", key: "limits.request-line", line: 2,
                  #"expected a size such as 8KiB, 1MiB or 512 (bytes), got "8KB""#),
        ErrorCase("limits:\n  request-line: 0", key: "limits.request-line", line: 2, "expected a size from 64B to 1MiB"),
        ErrorCase("limits:\n  request-line: -8KiB", key: "limits.request-line", line: 2, "expected a size"),
        ErrorCase("limits:\n  header-section: 64MiB", key: "limits.header-section", line: 2, "from 64B to 16MiB"),
        ErrorCase("limits:\n  header-section: 1GiB", key: "limits.header-section", line: 2, "expected a size"),
        ErrorCase("limits:\n  header-count: 0", key: "limits.header-count", line: 2, "from 1 to 10000, got 0"),
        ErrorCase("limits:\n  header-count: 8KiB", key: "limits.header-count", line: 2, "expected a number of header fields"),
        // durations
        ErrorCase("timeouts:\n  client-header: abc", key: "timeouts.client-header", line: 2,
                  #"expected a duration such as 15s or 500ms (positive, at most 24h), got "abc""#),
        ErrorCase("timeouts:\n  client-idle: 0s", key: "timeouts.client-idle", line: 2, #"got "0s""#),
        ErrorCase("timeouts:\n  upstream-connect: -5s", key: "timeouts.upstream-connect", line: 2, #"got "-5s""#),
        ErrorCase("timeouts:\n  upstream-response: 25h", key: "timeouts.upstream-response", line: 2, #"got "25h""#),
        ErrorCase("timeouts:\n  client-header: 1.5s", key: "timeouts.client-header", line: 2, #"got "1.5s""#),
        ErrorCase("timeouts:\n  client-header: 15 sec", key: "timeouts.client-header", line: 2, "expected a duration"),
        ErrorCase("drain-timeout: 0", key: "drain-timeout", line: 1, "expected a duration"),
        ErrorCase("drain-timeout: {seconds: 10}", key: "drain-timeout", line: 1, "got a mapping"),
        // log
        ErrorCase("log:\n  access: \"\"", key: "log.access", line: 2, "expected stdout, off or a file path"),
        ErrorCase("log: stdout", key: "log", line: 1, "expected a mapping"),
        // lists of items
        ErrorCase("rules: {}", key: "rules", line: 1, "expected a list of rules, got a mapping"),
        ErrorCase("variants: hero", key: "variants", line: 1, "expected a list of variants"),
        ErrorCase("variants:\n  - hero", key: "variants[0]", line: 2, "expected a variant"),
        // the document itself
        ErrorCase("- listen: 127.0.0.1:1", key: "", line: 1, "expected a mapping of settings"),
        ErrorCase("just a string", key: "", line: 1, "expected a mapping of settings"),
        ErrorCase("listen: [unclosed", key: "", line: 2, "not valid YAML"),
        ErrorCase("a: 1\n b: 2\n", key: "", line: 2, "not valid YAML"),
        ErrorCase("mode: normal\n---\nmode: normal\n", key: "", line: 2, "not valid YAML"),
        ErrorCase("? [a, b]\n: 1\n", key: "", line: 1, "expected a string key"),
    ]

    @Test("a bad value names its key and line", arguments: badValues)
    func badValue(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }

    @Test("the error reads file:line: key: message")
    func description() {
        let error = parseError("listen: 127.0.0.1:8877\ntimeouts:\n  client-header: abc\n")
        #expect(error?.description
            == #"test.yaml:3: timeouts.client-header: expected a duration such as 15s or 500ms (positive, at most 24h), got "abc""#)
        #expect(ConfigError(source: "--mode", key: "mode", message: "m").description == "--mode: mode: m")
        #expect(ConfigError(source: "f.yaml", key: "", line: 2, message: "m").description == "f.yaml:2: m")
    }
}

@Suite("Unknown and duplicate keys")
struct KeyTests {
    static let unknownKeys: [ErrorCase] = [
        ErrorCase("listn: 127.0.0.1:1", key: "listn", line: 1, #"unknown key "listn" (did you mean "listen"?)"#),
        ErrorCase("mode: normal\nfoo: 1", key: "foo", line: 2, #"unknown key "foo"; expected one of: listen, admin, mode"#),
        ErrorCase("state_dir: /x", key: "state_dir", line: 1, #"did you mean "state-dir"?"#),
        ErrorCase("admin:\n  tokn: x", key: "admin.tokn", line: 2, #"did you mean "token"?"#),
        ErrorCase("timeouts:\n  client_header: 5s", key: "timeouts.client_header", line: 2, #"did you mean "client-header"?"#),
        ErrorCase("timeouts:\n  clientHeader: 5s", key: "timeouts.clientHeader", line: 2, #"did you mean "client-header"?"#),
        ErrorCase("tags:\n  defaults:\n    allow-cellular: true", key: "tags.defaults.allow-cellular", line: 3, "unknown key"),
        ErrorCase("connect: {ports: [443], port: 80}", key: "connect.port", line: 1, #"did you mean "ports"?"#),
        ErrorCase("log:\n  acess: off", key: "log.acess", line: 2, #"did you mean "access"?"#),
        ErrorCase("limits:\n  max-body: 1MiB", key: "limits.max-body", line: 2, "expected one of: request-line, header-section, header-count"),
        ErrorCase("rules:\n  - name: r\n    tags: {allow-expensive: false}\n    matches: {host: x}", key: "rules[0].matches", line: 4,
                  #"did you mean "match"?"#),
        ErrorCase("rules:\n  - name: r\n    match: {hots: a}\n    tags: {allow-expensive: false}", key: "rules[0].match.hots", line: 3,
                  #"did you mean "host"?"#),
        ErrorCase("rules:\n  - name: r\n    tags: {allow-expensive: false, allow-data: true}", key: "rules[0].tags.allow-data", line: 3,
                  "unknown key"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n    wen: always",
                  key: "variants[0].wen", line: 5, #"did you mean "when"?"#),
    ]

    @Test("an unknown key is named with its line", arguments: unknownKeys)
    func unknownKey(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }

    static let duplicates: [ErrorCase] = [
        ErrorCase("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2", key: "listen", line: 2, #"duplicate key "listen" (first at line 1)"#),
        ErrorCase("timeouts:\n  client-idle: 5s\n  client-header: 1s\n  client-idle: 6s", key: "timeouts.client-idle", line: 4,
                  "first at line 2"),
        ErrorCase("rules:\n  - name: a\n    name: b\n    tags: {allow-expensive: false}", key: "rules[0].name", line: 3, "duplicate key"),
        ErrorCase("access:\n  users:\n    bob: x\n    bob: y", key: "access.users.bob", line: 4, #"duplicate key "bob""#),
        ErrorCase("admin: {token: a, \"token\": b}", key: "admin.token", line: 1, "duplicate key"),
    ]

    @Test("a key given twice is an error", arguments: duplicates)
    func duplicateKey(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }

    @Test("a key given three times is still named")
    func tripleKey() {
        let error = parseError("mode: normal\nmode: normal\nmode: normal\n")
        #expect(error?.key == "mode")
        #expect(error?.line == 1)
        #expect(error?.message.contains("duplicate key") == true)
    }
}

@Suite("Loading files")
struct LoadTests {
    @Test("a missing file is an error naming it")
    func missingFile() {
        #expect(throws: ConfigError(source: "/nonexistent/datamode.yaml", key: "",
                                    message: "cannot read the configuration file: no such file")) {
            try ProxyConfiguration.load(path: "/nonexistent/datamode.yaml")
        }
    }

    @Test("a directory is not a configuration file")
    func directory() throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        do {
            _ = try ProxyConfiguration.load(path: directory)
            Issue.record("loaded a directory")
        } catch {
            #expect(error.source == directory)
            #expect(error.message.contains("directory"))
        }
    }

    @Test("a file that is not UTF-8 is an error naming it")
    func notUTF8() throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/bad.yaml"
        _ = FileManager.default.createFile(atPath: path, contents: Data([0x6D, 0x6F, 0xFF, 0xFE, 0x0A]))
        do {
            _ = try ProxyConfiguration.load(path: path)
            Issue.record("loaded non-UTF-8 text")
        } catch {
            #expect(error.source == path)
            #expect(error.message.contains("UTF-8"))
        }
    }

    @Test("errors in a loaded file carry its path")
    func errorSource() throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/datamode.yaml"
        try "# comment\nthreads: many\n".write(toFile: path, atomically: true, encoding: .utf8)
        do {
            _ = try ProxyConfiguration.load(path: path)
            Issue.record("parsed")
        } catch {
            #expect(error.source == path)
            #expect(error.key == "threads")
            #expect(error.line == 2)
        }
    }
}
