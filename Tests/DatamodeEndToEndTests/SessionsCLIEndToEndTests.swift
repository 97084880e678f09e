// `datamode-proxy sessions` and `datamode-proxy watch` (SPEC §8, §12) against the real binary.
import DatamodeTestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing

@Suite("Sessions and watch: the command line", .serialized)
struct SessionsCLIEndToEndTests {
    @Test("`sessions ID --mode M`, `sessions`, `sessions ID`, `sessions ID --delete`, and the errors")
    func sessionsCommand() throws {
        try withAdminProxy(config: "sessions: {enabled: true}\n") { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let set = try ProxyProcess.runCLI(["sessions", "rig", "--mode", "low-data", "--profile", "nlc-3g", "--admin", address])
            #expect(set.status == 0, "\(set.stderr)")
            #expect(set.stdout.contains(#""mode":"constrained""#), "\(set.stdout)")
            #expect(try admin.get("/sessions/rig").object["profile"] as? String == "nlc-3g")
            let list = try ProxyProcess.runCLI(["sessions", "--admin", address])
            #expect(list.status == 0 && list.stdout.contains(#""id":"rig""#), "\(list.stdout)")
            let show = try ProxyProcess.runCLI(["sessions", "rig", "--admin", address])
            #expect(show.status == 0 && show.stdout.contains(#""requestsTotal":0"#), "\(show.stdout)")
            let badMode = try ProxyProcess.runCLI(["sessions", "rig", "--mode", "warp", "--admin", address])
            #expect(badMode.status != 0 && badMode.stderr.contains("unknown mode"))
            let badProfile = try ProxyProcess.runCLI(["sessions", "rig", "--mode", "normal", "--profile", "moon", "--admin", address])
            #expect(badProfile.status == 1 && badProfile.stderr.contains("no link profile"), "\(badProfile.stderr)")
            let delete = try ProxyProcess.runCLI(["sessions", "rig", "--delete", "--admin", address])
            #expect(delete.status == 0)
            let gone = try ProxyProcess.runCLI(["sessions", "rig", "--admin", address])
            #expect(gone.status == 1 && gone.stderr.contains("404"), "\(gone.stderr)")
        }
    }

    @Test("`sessions ID --mode M` with sessions off fails with the 409 and says why")
    func sessionsCommandWhileDisabled() throws {
        try withAdminProxy { proxy, admin throws in
            let set = try ProxyProcess.runCLI(["sessions", "rig", "--mode", "constrained", "--admin", "127.0.0.1:\(proxy.adminPort)"])
            #expect(set.status == 1, "\(set.output)")
            #expect(set.stderr.contains("409") && set.stderr.contains("sessions.enabled"), "\(set.stderr)")
            #expect(set.stdout.isEmpty, "\(set.stdout)")
            #expect(try admin.get("/sessions/rig").status == 404)
        }
    }

    @Test("`watch` prints the current mode, then each change, one line per event")
    func watchCommand() throws {
        try withAdminProxy { proxy, admin throws in
            let watch = Process()
            watch.executableURL = URL(fileURLWithPath: ProxyProcess.binaryPath)
            watch.arguments = ["watch", "--admin", "127.0.0.1:\(proxy.adminPort)"]
            let pipe = Pipe()
            watch.standardOutput = pipe
            watch.standardError = FileHandle.nullDevice
            let lines = Mutex<[String]>([])
            pipe.fileHandleForReading.readabilityHandler = { handle in
                let text = String(decoding: handle.availableData, as: UTF8.self)
                lines.withLock { $0 += text.split(separator: "\n").map(String.init) }
            }
            try watch.run()
            defer {
                // SIGKILL: a child of the test process inherits a mask that blocks SIGTERM (see `halt`).
                kill(watch.processIdentifier, SIGKILL)
                watch.waitUntilExit()
                pipe.fileHandleForReading.readabilityHandler = nil
            }
            func wait(_ count: Int) -> Bool {
                let deadline = Date().addingTimeInterval(10)
                while Date() < deadline {
                    if lines.withLock({ $0.count }) >= count { return true }
                    Thread.sleep(forTimeInterval: 0.02)
                }
                return false
            }
            #expect(wait(1))
            #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
            #expect(wait(2))
            let seen = lines.withLock { $0 }
            #expect(seen.first?.hasPrefix("mode {") == true && seen.first?.contains(#""mode":"normal""#) == true, "\(seen)")
            #expect(seen.dropFirst().first?.contains(#""mode":"expensive""#) == true, "\(seen)")
        }
    }
}
