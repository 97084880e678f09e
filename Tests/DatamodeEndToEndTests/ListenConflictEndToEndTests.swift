import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §6: a listen address already in use, by any process, stops start-up with an error naming the address,
/// whatever socket options the proxy's own workers use between themselves (SO_REUSEPORT).
@Suite struct ListenConflictEndToEndTests {
    /// Starts a proxy expected to fail; returns its exit status (nil: still running after 15 s) and stderr.
    static func failedStart(_ arguments: [String]) throws -> (status: Int32?, stderr: String) {
        let proxy = try ProxyProcess(config: "", arguments: arguments, waitForReady: false)
        defer { proxy.stop() }
        let status = proxy.waitForExit(timeout: 15)
        return (status, proxy.stderr)
    }

    static func get(_ url: String, via port: UInt16) throws -> ParsedResponse {
        try RawHTTPClient.exchange(RequestText.make("GET", url), to: port)
    }

    @Test func aSecondProxyOnTheSameListenAddressExitsNamingIt() throws {
        let origin = try RecordingOrigin { _ in .ok("first") }
        defer { origin.stop() }
        let first = try ProxyProcess(config: "")
        defer { first.stop() }
        let address = "127.0.0.1:\(first.port)"

        let second = try Self.failedStart(["--listen", address, "--mode", "constrained"])
        #expect(second.status != nil && second.status != 0, "the second proxy kept running: \(second.stderr)")
        #expect(second.stderr.contains(address), "\(second.stderr)")
        #expect(second.stderr.contains("in use"), "\(second.stderr)")

        // Every connection still reaches the first proxy, and only it.
        for _ in 0..<20 { #expect(try Self.get(origin.url("/x"), via: first.port).status == 200) }
    }

    @Test(arguments: [false, true])
    func anotherProgramListeningOnThePortStopsStartUp(reusePort: Bool) throws {
        let foreign = try ForeignListener(reusePort: reusePort)
        defer { foreign.close() }
        let address = "127.0.0.1:\(foreign.port)"
        let result = try Self.failedStart(["--listen", address])
        #expect(result.status != nil && result.status != 0, "started beside a listener (SO_REUSEPORT \(reusePort)): \(result.stderr)")
        #expect(result.stderr.contains(address), "\(result.stderr)")
    }

    @Test func aTakenAdminAddressStopsStartUpNamingIt() throws {
        let first = try ProxyProcess(config: "")
        defer { first.stop() }
        let address = "127.0.0.1:\(first.adminPort)"
        let result = try Self.failedStart(["--admin-listen", address])
        #expect(result.status != nil && result.status != 0, "\(result.stderr)")
        #expect(result.stderr.contains("admin"), "\(result.stderr)")
        #expect(result.stderr.contains(address), "\(result.stderr)")
        #expect(result.stderr.contains("in use"), "\(result.stderr)")
    }

    /// The check must not mistake the connections a stopped proxy left in TIME_WAIT for a listener: a restart
    /// on the same address works at once.
    @Test func aRestartOnTheSameAddressWorksDespiteTimeWait() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let first = try ProxyProcess(config: "")
        let address = "127.0.0.1:\(first.port)"
        // `Connection: close`: the proxy closes first, so its side of each connection is left in TIME_WAIT.
        for _ in 0..<3 {
            let response = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/x"), headers: [("Connection", "close")]),
                                                    to: first.port)
            #expect(response.status == 200)
        }
        first.stop()
        #expect(first.waitForExit() == 0)

        let second = try ProxyProcess(config: "", arguments: ["--listen", address])
        defer { second.stop() }
        #expect(second.port == first.port)
        #expect(try Self.get(origin.url("/y"), via: second.port).status == 200)
    }
}
