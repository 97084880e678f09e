import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §16 for real: a network namespace of the test's own, the proxy's transparent listener in it, the
/// `transparent-rules` command's iptables rules applied in it, origins on "remote" addresses in it, and curl with no
/// proxy setting at all (run as `nobody`, whose TCP the rules redirect). Everything is removed afterwards, even when
/// a test fails: the namespace takes its rules and addresses with it.
///
/// Needs root, iptables and ip6tables (`scripts/bootstrap.sh --test`); without them the tests are skipped with a
/// loud message, except in CI (`CI` set), where they run and fail.
@Suite("Transparent sidecar (SPEC §16)", .serialized, .enabled(if: NetworkNamespace.testsEnabled, "needs root and iptables"))
struct TransparentSidecarEndToEndTests {
    /// The namespace, the origins, the proxy and the rules of one test.
    final class Sidecar {
        let namespace: NetworkNamespace
        let directory: String
        /// Plain HTTP on every address of the namespace (`::`, both families).
        var origin: HTTPSOrigin!
        /// Plain HTTP on the decoy address only: a forged Host that named it must not reach it.
        var decoy: HTTPSOrigin!
        /// TLS for secure.example, open.example and decoy.example, on every address; no IP in its certificate, so
        /// verifying it needs the SNI name.
        var secure: HTTPSOrigin!
        var proxy: ProxyProcess!
        var transparentPort: UInt16 = 0

        /// Starts everything; `config` is added to the proxy's configuration (`ORIGIN` is replaced by the plain
        /// origin's port).
        init(config: String = "") throws {
            namespace = try NetworkNamespace()
            directory = try ScratchDirectory.make("datamode-transparent")
            do {
                origin = try HTTPSOrigin(directory: directory + "/origin", bind: "::", tls: false, launcher: namespace.launcher)
                decoy = try HTTPSOrigin(directory: directory + "/decoy", bind: NetworkNamespace.decoyV4, tls: false,
                                        launcher: namespace.launcher)
                secure = try HTTPSOrigin(directory: directory + "/secure", names: ["secure.example", "open.example", "decoy.example"],
                                         addresses: [], bind: "::", launcher: namespace.launcher)
                for site in [origin!, secure!] {
                    try site.publish("img/hero.jpg", Array(repeating: 0x4a, count: 50_000))
                    try site.publish("img/hero@small.jpg", Array(repeating: 0x73, count: 500))
                    try site.publish("video.mp4", Array(repeating: 0x76, count: 20_000))
                    try site.publish("page.html", Array("<html>page</html>\n".utf8))
                }
                let yaml = """
                    mode: constrained
                    threads: 1
                    access: {allow: [127.0.0.0/8, "::1/128", 10.77.0.0/16, "fd77::/16"]}
                    transparent: {listen: "[::]:0"}
                    rules:
                      - {name: video, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
                      - {name: heroes, match: {path: "/img/*"}, tags: {allow-constrained: false}}
                    variants:
                      - {id: hero-small, match: "http://10.77.0.2:ORIGIN/img/*.jpg", target: "http://10.77.0.2:ORIGIN/img/$1@small.jpg"}
                    tls: {intercept: [secure.example]}
                    connect: {ports: [443, SECURE]}

                    """.replacingOccurrences(of: "ORIGIN", with: "\(origin.port)")
                    .replacingOccurrences(of: "SECURE", with: "\(secure.port)") + config
                let started = try TransparentProxyLaunch.start(in: namespace, directory: directory, yaml: yaml,
                                                               trusting: secure.certificatePath)
                proxy = started.proxy
                transparentPort = started.transparentPort
            } catch {
                stop()
                throw error
            }
        }

        func stop() {
            proxy?.stop()
            for site in [origin, decoy, secure] as [HTTPSOrigin?] { site?.stop() }
            namespace.remove()
            ScratchDirectory.remove(directory)
        }

        /// `curl -i` inside the namespace, no proxy settings, as `nobody`.
        func curl(_ arguments: [String]) throws -> ExternalCommand.Result {
            try namespace.curl(["-i"] + arguments)
        }

        func metrics() throws -> MetricsScrape {
            let result = try namespace.run(["/usr/bin/curl", "-sS", "--noproxy", "*", "http://127.0.0.1:\(proxy.adminPort)/metrics"])
            return try MetricsScrape(result.stdout)
        }

        /// The access log lines whose url is `url`, waiting a little for the log writer.
        func logLines(_ matching: (([String: Any]) -> Bool)) -> [[String: Any]] {
            for _ in 0..<100 {
                let lines = proxy.accessLog.filter(matching)
                if !lines.isEmpty { return lines }
                usleep(20_000)
            }
            return []
        }
    }

    static func status(_ result: ExternalCommand.Result) -> Int? {
        let lines = result.stdout.split(separator: "\r\n", omittingEmptySubsequences: false)
        // The last status line (after any 1xx).
        let statusLines = lines.filter { $0.hasPrefix("HTTP/") }
        return statusLines.last.flatMap { Int($0.split(separator: " ")[1]) }
    }

    @Test("plain HTTP with no proxy setting is tagged, refused and rewritten; IPv4 and IPv6",
          arguments: [NetworkNamespace.remoteV4, "[\(NetworkNamespace.remoteV6)]"])
    func plainHTTP(_ host: String) throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let base = "http://\(host):\(sidecar.origin.port)"

        let echoed = try sidecar.curl([base + "/echo-headers"])
        #expect(Self.status(echoed) == 200, "\(echoed.output)\n\(sidecar.proxy.stderr)")
        // Tagged and Via'd by the proxy: the origin saw what the proxy forwarded.
        #expect(echoed.stdout.contains("Allow-Constrained: ?1"))
        #expect(echoed.stdout.contains("Save-Data: on"))
        #expect(echoed.stdout.contains("Via: 1.1 datamode-proxy"))

        let refused = try sidecar.curl([base + "/video.mp4"])
        #expect(Self.status(refused) == 403)
        #expect(refused.stdout.contains("Content-Type: application/problem+json"))
        #expect(refused.stdout.contains("Network-Unavailable-Reason: constrained"))
        #expect(refused.stdout.contains("\"error\":\"constrained\""))
        #expect(refused.stdout.contains("\"url\":\"\(base)/video.mp4\""))

        let line = try #require(sidecar.logLines { ($0["url"] as? String) == base + "/video.mp4" }.first)
        #expect(line["source"] as? String == "transparent")
        #expect(line["outcome"] as? String == "rejected")
        #expect(try sidecar.metrics().counter("datamode_transparent_connections_total", ["kind": "http"]) >= 2)
    }

    @Test("a refused image is rewritten to its variant, fetched from the same original destination")
    func variant() throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let rewritten = try sidecar.curl(["http://\(NetworkNamespace.remoteV4):\(sidecar.origin.port)/img/hero.jpg"])
        #expect(Self.status(rewritten) == 200, "\(rewritten.output)")
        #expect(rewritten.stdout.contains("Data-Mode-Variant: hero-small"))
        #expect(rewritten.stdout.contains("Content-Length: 500"))
    }

    @Test("a Host naming another address still goes to the original destination; no Host is 400; h3 leaves Alt-Svc")
    func forgedHost() throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let base = "http://\(NetworkNamespace.remoteV4):\(sidecar.origin.port)"
        let decoyHost = "\(NetworkNamespace.decoyV4):\(sidecar.decoy.port)"
        let forged = try sidecar.curl(["-H", "Host: \(decoyHost)", base + "/echo-headers"])
        #expect(Self.status(forged) == 200, "\(forged.output)")
        #expect(forged.stdout.contains("Host: \(decoyHost)"))
        // The request is named by its Host (policy, log), and went to 10.77.0.2 all the same.
        #expect(sidecar.origin.log.contains("REQUEST GET /echo-headers"))
        #expect(!sidecar.decoy.log.contains("REQUEST"))
        #expect(!sidecar.logLines { ($0["url"] as? String) == "http://\(decoyHost)/echo-headers" }.isEmpty)

        let noHost = try sidecar.namespace.run(["/usr/bin/curl", "-sS", "-i", "--noproxy", "*", "-0", "-H", "Host:", base + "/page.html"],
                                               asClient: true)
        #expect(Self.status(noHost) == 400, "\(noHost.output)")
        #expect(noHost.stdout.contains("\"error\":\"bad-request\""))

        let alternatives = try sidecar.curl([base + "/alt-svc"])
        #expect(Self.status(alternatives) == 200)
        #expect(alternatives.stdout.contains("Alt-Svc: h2=\"alt.example:443\"; ma=60\r\n"), "\(alternatives.stdout)")
        #expect(!alternatives.stdout.contains("h3"))
    }

    @Test("a transparent connection idle long enough to park wakes still pinned to its original destination")
    func parkedStaysPinned() throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let base = "http://\(NetworkNamespace.remoteV4):\(sidecar.origin.port)"
        let decoyHost = "\(NetworkNamespace.decoyV4):\(sidecar.decoy.port)"
        let before = try sidecar.metrics().counter("datamode_transparent_connections_total", ["kind": "http"])
        // Three requests on one connection, 400 ms apart (curl --rate): the connection parks after 100 ms idle
        // between them, and each wakes as a new session on the same socket.
        let paced = try sidecar.curl(["--rate", "150/m", "-H", "Host: \(decoyHost)", base + "/echo-headers",
                                      base + "/page.html", base + "/video.mp4"])
        #expect(paced.stdout.components(separatedBy: "HTTP/1.1 200").count - 1 == 2, "\(paced.output)")
        #expect(paced.stdout.contains("HTTP/1.1 403"), "the mode still applies after parking")
        #expect(try sidecar.metrics().counter("datamode_transparent_connections_total", ["kind": "http"]) == before + 1,
                "one connection")
        #expect(!sidecar.decoy.log.contains("REQUEST"), "never to the address the Host named")
        #expect(sidecar.origin.log.contains("REQUEST GET /page.html"))
        let lines = sidecar.logLines { ($0["url"] as? String) == "http://\(decoyHost)/video.mp4" }
        #expect(lines.first?["source"] as? String == "transparent")
    }

    @Test("TLS to an intercepted host: a leaf for the SNI name, the refusal inside TLS, verification by the SNI name",
          arguments: [NetworkNamespace.remoteV4, NetworkNamespace.remoteV6])
    func tlsIntercepted(_ address: String) throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let port = sidecar.secure.port
        let resolve = ["--resolve", "secure.example:\(port):\(address.contains(":") ? "[\(address)]" : address)",
                       "--cacert", sidecar.directory + "/ca.pem"]
        let refused = try sidecar.curl(resolve + ["-v", "https://secure.example:\(port)/video.mp4"])
        #expect(Self.status(refused) == 403, "\(refused.output)\n\(sidecar.proxy.stderr)")
        #expect(refused.stdout.contains("\"error\":\"constrained\""))
        #expect(refused.stdout.contains("\"url\":\"https://secure.example:\(port)/video.mp4\""))
        #expect(refused.stderr.contains("matched cert's \"secure.example\""))
        #expect(refused.stderr.contains("issuer: O=datamode-proxy; CN=datamode-proxy CA"))

        let allowed = try sidecar.curl(resolve + ["https://secure.example:\(port)/page.html"])
        #expect(Self.status(allowed) == 200, "\(allowed.output)\n\(sidecar.proxy.stderr)")
        #expect(allowed.stdout.contains("<html>page</html>"))
        // curl offers h2 and gets it (SPEC §17 on transparent TLS too): field names are lowercase.
        #expect(allowed.stdout.contains("via: 1.1 datamode-proxy"), "\(allowed.stdout)")

        let inside = sidecar.logLines { ($0["url"] as? String) == "https://secure.example:\(port)/page.html" }
        #expect(inside.first?["source"] as? String == "transparent")
        #expect(inside.first?["proto"] as? String == "h2")
        #expect(try sidecar.metrics().counter("datamode_transparent_connections_total", ["kind": "tls-intercepted"]) == 2)
    }

    @Test("TLS to a host not intercepted is relayed blind and spliced, to the original address whatever the SNI says",
          arguments: ["open.example", "decoy.example"])
    func tlsBypassed(_ name: String) throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        let port = sidecar.secure.port
        // decoy.example resolves nowhere in the namespace: only the original address can have answered.
        let result = try sidecar.curl(["--resolve", "\(name):\(port):\(NetworkNamespace.remoteV4)",
                                       "--cacert", sidecar.secure.certificatePath, "-v",
                                       "https://\(name):\(port)/bytes/300000", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"])
        #expect(result.stdout.hasSuffix("200 300000"), "\(result.output)\n\(sidecar.proxy.stderr)")
        // The origin's own certificate: nothing was intercepted.
        #expect(result.stderr.contains("subject: CN=localhost"))
        let tunnel = try #require(sidecar.logLines { ($0["method"] as? String) == "CONNECT" }.first)
        #expect(tunnel["url"] as? String == "\(name):\(port)")
        #expect(tunnel["source"] as? String == "transparent")
        #expect((tunnel["bytesOut"] as? Int ?? 0) > 300_000)
        let metrics = try sidecar.metrics()
        #expect(metrics.counter("datamode_transparent_connections_total", ["kind": "tls-tunnel"]) == 1)
        #expect(metrics.counter("datamode_tunnel_splices_total") >= 1)
    }

    @Test("bytes that are neither HTTP nor TLS are relayed blind to the original destination")
    func otherBytes() throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        // The plain origin (Python's http.server) answers a line that is no HTTP/1.x request with its own error page,
        // without a status line (it takes it for HTTP/0.9): relayed both ways, untouched.
        let script = """
            import socket
            s = socket.create_connection(("\(NetworkNamespace.remoteV4)", \(sidecar.origin.port)))
            s.sendall(b"HELLO THERE\\r\\n\\r\\n")
            reply = b""
            while True:
                data = s.recv(65536)
                if not data:
                    break
                reply += data
            print(reply.decode(errors="replace"))
            """
        let result = try sidecar.namespace.run(["/usr/bin/python3", "-c", script], asClient: true)
        #expect(result.stdout.contains("Bad HTTP/0.9 request type ('HELLO')"), "\(result.output)\n\(sidecar.proxy.stderr)")
        #expect(try sidecar.metrics().counter("datamode_transparent_connections_total", ["kind": "other"]) == 1)
        #expect(sidecar.logLines { ($0["method"] as? String) == "CONNECT" }.first?["url"] as? String
            == "\(NetworkNamespace.remoteV4):\(sidecar.origin.port)")
    }

    @Test("a connection straight to the transparent port has no destination: closed and logged")
    func noDestination() throws {
        let sidecar = try Sidecar()
        defer { sidecar.stop() }
        for address in ["127.0.0.1", "[::1]"] {
            // As root: the rules let the proxy's own user through, so this one is not redirected.
            let result = try sidecar.namespace.run(["/usr/bin/curl", "-sS", "--noproxy", "*", "--max-time", "5",
                                                    "http://\(address):\(sidecar.transparentPort)/"])
            #expect(result.status != 0)
            #expect(!result.stdout.contains("HTTP/"))
        }
        let lines = sidecar.logLines { ($0["reason"] as? String) == "transparent-no-destination" }
        #expect(lines.count >= 1)
        #expect(lines.first?["source"] as? String == "transparent")
        #expect(sidecar.proxy.stderr.contains("transparent-no-destination"))
    }

    @Test("transparent-rules: idempotent, removes exactly its own, and says what is missing")
    func rulesCommand() throws {
        let namespace = try NetworkNamespace()
        defer { namespace.remove() }
        let binary = ProxyProcess.binaryPath
        // Someone else's rule in the same chain, which must survive.
        #expect(try namespace.run(["/usr/sbin/iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-d", "10.9.9.9", "-j", "ACCEPT"]).status == 0)
        let apply = [binary, "transparent-rules", "--port", "15001", "--uid", "1000", "--ipv6", "--ports", "80,443,8000-8100", "--apply"]
        #expect(try namespace.run(apply).status == 0)
        #expect(try namespace.run(apply).status == 0)
        let rules = try namespace.run(["/usr/sbin/iptables", "-w", "-t", "nat", "-S"]).stdout
        #expect(rules.components(separatedBy: "-A OUTPUT -p tcp -j DATAMODE_OUTPUT").count == 2, "\(rules)")
        #expect(rules.contains("-A DATAMODE_OUTPUT -m owner --uid-owner 1000 -j RETURN"))
        #expect(rules.contains("-A DATAMODE_OUTPUT -p tcp -m tcp --dport 8000:8100 -j REDIRECT --to-ports 15001"))
        let filter = try namespace.run(["/usr/sbin/ip6tables", "-w", "-S"]).stdout
        #expect(filter.contains("-A DATAMODE_OUTPUT -p udp -m udp --dport 443 -j REJECT"))
        // What --apply runs is what the default prints.
        let printed = try ProxyProcess.runCLI(["transparent-rules", "--port", "15001", "--uid", "1000", "--ipv6", "--ports", "80,443,8000-8100"])
        #expect(printed.status == 0)
        #expect(printed.stdout.contains("iptables -w -t nat -A DATAMODE_OUTPUT -m owner --uid-owner 1000 -j RETURN"))

        let remove = [binary, "transparent-rules", "--port", "15001", "--uid", "1000", "--ipv6", "--remove"]
        #expect(try namespace.run(remove).status == 0)
        #expect(try namespace.run(remove).status == 0)
        for tool in ["/usr/sbin/iptables", "/usr/sbin/ip6tables"] {
            for table in ["nat", "filter"] {
                let left = try namespace.run([tool, "-w", "-t", table, "-S"]).stdout
                #expect(!left.contains("DATAMODE"), "\(tool) \(table): \(left)")
            }
        }
        #expect(try namespace.run(["/usr/sbin/iptables", "-w", "-t", "nat", "-S"]).stdout.contains("-A OUTPUT -d 10.9.9.9/32 -j ACCEPT"))

        let noIPTables = try namespace.run([binary, "transparent-rules", "--port", "15001", "--uid", "0", "--apply"],
                                           environment: ["PATH": "/nonexistent"])
        #expect(noIPTables.status != 0)
        #expect(noIPTables.stderr == "datamode-proxy: iptables not found on PATH: install it (Debian: apt-get install iptables)\n")
        let noCapability = try namespace.run([binary, "transparent-rules", "--port", "15001", "--uid", "0", "--apply"], asClient: true)
        #expect(noCapability.status != 0)
        #expect(noCapability.stderr.hasPrefix("datamode-proxy: the NET_ADMIN capability is missing"))
        #expect(noCapability.stderr.split(separator: "\n").count == 1)
    }
}

/// The README's "Sidecar without proxy settings", run as it is written: its shell block, with the namespace and
/// directory name made unique, under bash as root, the built binary first on PATH.
@Suite("README: sidecar without proxy settings", .enabled(if: NetworkNamespace.testsEnabled, "needs root and iptables"))
struct TransparentReadmeWalkthroughTests {
    static func readmeBlock() throws -> String {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: "## Sidecar without proxy settings"))
        let section = readme[start.upperBound...]
        let open = try #require(section.range(of: "```sh\n"))
        let close = try #require(section[open.upperBound...].range(of: "\n```"))
        return String(section[open.upperBound..<close.lowerBound])
    }

    /// `slowStart`: the proxy and the origin each take 1.5 s to start (a loaded CI machine takes that long), so a
    /// walk-through that sleeps a fixed time instead of waiting for them fails.
    @Test(arguments: [false, true]) func walkthrough(slowStart: Bool) throws {
        let block = try Self.readmeBlock()
        #expect(block.contains("transparent-rules --port 15001 --uid 0 --apply"))
        #expect(!block.contains("export http_proxy") && !block.contains("-x http"))
        let name = "dmt-\(UUID().uuidString.prefix(8).lowercased())"
        // Every command that touches the network names the namespace; if it cannot be made, they all fail inside.
        let script = "set -e\ntrap 'status=$?; set +e; kill -KILL $(jobs -p) 2>/dev/null; ip netns del \(name) 2>/dev/null; "
            + "rm -rf /tmp/\(name); exit $status' EXIT\n" + block.replacingOccurrences(of: "dm-demo", with: name)
        defer { _ = try? ExternalCommand.run(NetworkNamespace.ip, ["netns", "del", name]) }
        var binaryDirectory = URL(fileURLWithPath: ProxyProcess.binaryPath).deletingLastPathComponent().path
        let wrappers = NSTemporaryDirectory() + "\(name)-slow"
        defer { try? FileManager.default.removeItem(atPath: wrappers) }
        if slowStart {
            try FileManager.default.createDirectory(atPath: wrappers, withIntermediateDirectories: true)
            let slow = [("datamode-proxy", ProxyProcess.binaryPath, "run"), ("python3", "/usr/bin/python3", "-m")]
            for (tool, real, slowWhen) in slow {
                let wrapper = "#!/bin/sh\n[ \"$1\" = \(slowWhen) ] && sleep 1.5\nexec \(real) \"$@\"\n"
                FileManager.default.createFile(atPath: wrappers + "/" + tool, contents: Data(wrapper.utf8),
                                               attributes: [.posixPermissions: 0o755])
            }
            binaryDirectory = wrappers
        }
        // The test runner's blocked SIGTERM is inherited by what it starts; the walk-through's `kill` needs it back.
        let unblocked = "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
            + "os.execv('/bin/bash', ['bash', '-c', sys.argv[1]])"
        let result = try ExternalCommand.run("/usr/bin/python3", ["-c", unblocked, script], environment: [
            "PATH": "\(binaryDirectory):/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin", "HOME": "/tmp",
        ], timeout: 60)
        #expect(result.status == 0, "\(result.output)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains("a page"), "\(result.output)")
        #expect(result.stdout.contains("\"error\":\"constrained\""))
        #expect(result.stdout.contains("\"url\":\"http://10.77.0.2:8080/intro.mp4\""))
        #expect(lines.last == "2")
        #expect(!FileManager.default.fileExists(atPath: "/var/run/netns/\(name)"))
    }
}
