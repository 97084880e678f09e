@testable import DatamodeEngine
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
import Foundation
import Testing

/// The pieces of HTTPS interception (SPEC §9) that need no socket: the CA's files, leaves and their cache, what a
/// request inside a tunnel is, and the connection machine's new phase.
@Suite struct InterceptionTests {
    static func scratch() throws -> String {
        let path = NSTemporaryDirectory() + "datamode-ca-unit-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test func aCAIsCreatedExclusivelyAndLoadedBack() throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (cert, key) = (directory + "/ca/ca.pem", directory + "/ca/ca-key.pem")
        let created = try CertificateAuthority.create(certificatePath: cert, keyPath: key)
        var info = stat()
        #expect(stat(key, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(stat(directory + "/ca", &info) == 0 && info.st_mode & 0o777 == 0o700)
        let loaded = try CertificateAuthority.load(certificatePath: cert, keyPath: key)
        #expect(loaded.fingerprint == created.fingerprint)
        #expect(loaded.certificatePEM.hasPrefix("-----BEGIN CERTIFICATE-----"))
        // Never overwritten without `replace`, even a key alone (a half-present CA).
        #expect(throws: CertificateAuthorityError.self) { try CertificateAuthority.create(certificatePath: cert, keyPath: key) }
        unlink(cert)
        #expect(throws: CertificateAuthorityError.self) { try CertificateAuthority.create(certificatePath: cert, keyPath: key) }
        let replaced = try CertificateAuthority.create(certificatePath: cert, keyPath: key, replace: true)
        #expect(replaced.fingerprint != created.fingerprint)
    }

    @Test func aPlantedLinkIsNeverFollowedWhenTheKeyIsCreated() throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A dangling link where the key will be: O_EXCL|O_NOFOLLOW refuses it instead of writing the key elsewhere.
        symlink(directory + "/elsewhere", directory + "/ca-key.pem")
        #expect(throws: CertificateAuthorityError.self) {
            try CertificateAuthority.create(certificatePath: directory + "/ca.pem", keyPath: directory + "/ca-key.pem")
        }
        #expect(!FileManager.default.fileExists(atPath: directory + "/elsewhere"))
    }

    @Test(arguments: [0o640, 0o604, 0o644, 0o660] as [mode_t])
    func aKeyOthersCanReadIsRefused(_ mode: mode_t) throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (cert, key) = (directory + "/ca.pem", directory + "/ca-key.pem")
        _ = try CertificateAuthority.create(certificatePath: cert, keyPath: key)
        chmod(key, mode)
        let error = #expect(throws: CertificateAuthorityError.self) { try CertificateAuthority.load(certificatePath: cert, keyPath: key) }
        #expect(error?.description.contains("readable by group or others") == true, "\(String(describing: error))")
        chmod(key, 0o400)
        _ = try CertificateAuthority.load(certificatePath: cert, keyPath: key)
    }

    @Test func aKeyOwnedByAnotherUserIsRefused() throws {
        guard geteuid() == 0 else { return }  // only root can give a file away; the check itself is the same
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (cert, key) = (directory + "/ca.pem", directory + "/ca-key.pem")
        _ = try CertificateAuthority.create(certificatePath: cert, keyPath: key)
        chown(key, 65534, 65534)
        let error = #expect(throws: CertificateAuthorityError.self) { try CertificateAuthority.load(certificatePath: cert, keyPath: key) }
        #expect(error?.description.contains("owned by uid 65534") == true)
    }

    @Test func leavesAreCachedBoundedAndOnlyForHostNames() throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let authority = try CertificateAuthority.create(certificatePath: directory + "/ca.pem", keyPath: directory + "/ca-key.pem")
        let cache = LeafCache(authority: authority, clock: SystemClock(), capacity: 2)
        let a = cache.leaf(for: "a.example")
        #expect(a != nil)
        #expect(cache.leaf(for: "a.example") == a)
        #expect(cache.minted == 1)
        _ = cache.leaf(for: "b.example")
        _ = cache.leaf(for: "a.example")  // a is now the most recently used
        _ = cache.leaf(for: "c.example")  // evicts b
        #expect(cache.count == 2)
        #expect(cache.minted == 3)
        _ = cache.leaf(for: "a.example")
        #expect(cache.minted == 3)
        _ = cache.leaf(for: "b.example")
        #expect(cache.minted == 4)
        for bad in ["", "a,DNS:evil.example", "a b", "x..example", String(repeating: "a", count: 64) + ".example", "é.example"] {
            #expect(cache.leaf(for: bad) == nil, "\(bad)")
        }
        #expect(cache.leaf(for: "::1") != nil)
        #expect(cache.leaf(for: "192.0.2.7") != nil)
    }

    /// A new host costs one ECDSA P-256 signature (the leaf key is made once, at start-up). Measured, not asserted:
    /// the machine is shared; the number goes to the report and the README.
    @Test func mintingALeafForANewHostCostsOneSignature() throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let authority = try CertificateAuthority.create(certificatePath: directory + "/ca.pem", keyPath: directory + "/ca-key.pem")
        let cache = LeafCache(authority: authority, clock: SystemClock(), capacity: 4096)
        let count = 200
        let start = DispatchTime.now().uptimeNanoseconds
        for i in 0..<count { #expect(cache.leaf(for: "host\(i).example") != nil) }
        let perHost = Double(DispatchTime.now().uptimeNanoseconds - start) / Double(count) / 1000
        let hitStart = DispatchTime.now().uptimeNanoseconds
        for i in 0..<count { _ = cache.leaf(for: "host\(i).example") }
        let perHit = Double(DispatchTime.now().uptimeNanoseconds - hitStart) / Double(count) / 1000
        print("leaf mint: \(String(format: "%.1f", perHost)) us per new host, cache hit \(String(format: "%.2f", perHit)) us (debug build)")
        #expect(cache.minted == count)
    }

    static func tunnel(_ host: String = "cdn.example", _ port: UInt16 = 443) -> InterceptedOrigin {
        InterceptedOrigin(host: host, port: port)
    }

    static func inside(_ tunnel: InterceptedOrigin, _ target: String, method: String = "GET", host: String?)
        -> Result<RequestTarget, Admission.InsideRefusal> {
        guard case .success(let parsed) = RequestTarget.parse(target, method: method) else { fatalError("bad target \(target)") }
        return Admission.targetInside(tunnel, parsed, host: host)
    }

    @Test func aRequestInsideIsAnHTTPSRequestForTheTunnelsAuthorityWithoutTheDefaultPort() throws {
        let target = try Self.inside(Self.tunnel(), "/img/a.jpg?x=1", host: "cdn.example").get()
        #expect(target.absoluteURL == "https://cdn.example/img/a.jpg?x=1")
        #expect(target.scheme == "https" && target.port == 443 && target.hostHeaderValue == "cdn.example")
        let other = try Self.inside(Self.tunnel("cdn.example", 8443), "/a", host: "CDN.example:8443").get()
        #expect(other.absoluteURL == "https://cdn.example:8443/a")
        let v6 = try Self.inside(Self.tunnel("::1", 443), "/a", host: "[::1]").get()
        #expect(v6.absoluteURL == "https://[::1]/a")
        // Host with the default port spelled out, or no Host (HTTP/1.0): the same authority.
        #expect((try? Self.inside(Self.tunnel(), "/", host: "cdn.example:443").get()) != nil)
        #expect((try? Self.inside(Self.tunnel(), "/", host: nil).get()) != nil)
        #expect((try? Self.inside(Self.tunnel(), "https://cdn.example/p", host: "cdn.example").get())?.absoluteURL == "https://cdn.example/p")
    }

    @Test(arguments: [
        ("/", "other.example"), ("/", "cdn.example:8443"), ("https://other.example/p", "other.example"),
        ("http://cdn.example/p", "cdn.example"), ("https://cdn.example:444/p", nil),
    ] as [(String, String?)])
    func anotherAuthorityIsMisdirected(_ target: String, _ host: String?) {
        guard case .failure(let refusal) = Self.inside(Self.tunnel(), target, host: host) else {
            Issue.record("accepted \(target) with Host \(host ?? "-")")
            return
        }
        #expect(refusal.code == .misdirectedRequest)
    }

    @Test func connectInsideATunnelIsABadRequest() {
        guard case .failure(let refusal) = Self.inside(Self.tunnel(), "cdn.example:443", method: "CONNECT", host: nil) else {
            Issue.record("accepted")
            return
        }
        #expect(refusal.code == .badRequest)
    }

    @Test func openingAnInterceptionIsBoundedByClientHeaderThenReadsHeads() {
        typealias Machine = HTTP1SessionStateMachine<Int>
        var machine = Machine(timeouts: .init(clientIdle: 60_000, clientHeader: 15_000, drain: 10_000))
        #expect(machine.openInterception(7) == .armTimer(milliseconds: 15_000))
        #expect(machine.exchange == 7)
        #expect(machine.interceptionEstablished() == .armTimer(milliseconds: 60_000))
        #expect(machine.isReadingHead)
        var stalled = Machine(timeouts: .init(clientIdle: 60_000, clientHeader: 15_000, drain: 10_000))
        _ = stalled.openInterception(8)
        #expect(stalled.timerFired(outputBacklog: 0) == .close)
        #expect(stalled.isClosed)
    }
}
