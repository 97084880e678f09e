// SPEC §18.3 "at least once, nothing lost", through the real binary: 50 SIGKILLs at random moments while a client
// streams deferred uploads (and, every few rounds, while they are being delivered). Every upload that got its 202
// reaches the origin at least once after the restarts, byte for byte, and an upload seen twice carries the same
// Idempotency-Key both times.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Deferral crash safety: end to end", .serialized)
struct DeferralCrashEndToEndTests {
    @Test("50 SIGKILLs while uploads are stored and delivered: every 202 delivered, duplicates only with their key")
    func fiftyKills() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 8 << 20) { _ in .status(201, "") }
        defer { origin.stop() }
        let root = try ScratchDirectory.make("deferral-kill")
        defer { ScratchDirectory.remove(root) }
        let arguments = ["--state-dir", root + "/state", "--mode", "constrained"]
        var generator = SeededGenerator(seed: 2811)
        let accepted = Mutex<[String: UInt64]>([:])   // id -> seed of the uploads answered 202
        var seed: UInt64 = 0
        var kills = 0
        for round in 0..<50 {
            let proxy = try ProxyProcess(config: "", arguments: arguments, directory: root)
            let admin = AdminAPIClient(port: proxy.adminPort)
            // The API's mode is persisted: a round that lifted it starts constrained again.
            _ = try? admin.put("/mode", #"{"mode": "constrained"}"#)
            let first = seed
            seed += 1_000
            let port = proxy.port
            let originPort = origin.port
            let stop = Atomic<Bool>(false)
            let done = Atomic<Bool>(false)
            Thread.detachNewThread {
                defer { done.store(true, ordering: .releasing) }
                guard let client = try? RawHTTPClient(port: port, timeout: .seconds(20)) else { return }
                var current = first
                while !stop.load(ordering: .acquiring) {
                    let size = min(SeededUploadBody.size(seed: current), 512 << 10)
                    let body = SeededUploadBody.bytes(seed: current, count: size)
                    guard let response = try? upload(client, "http://127.0.0.1:\(originPort)/u/\(current)", body: body,
                                                     headers: [("Allow-Constrained", "?0"), ("Prefer", "respond-async"),
                                                               ("X-Seed", String(current))]) else { return }
                    if response.status == 202, let id = response.value(of: "Data-Mode-Deferred") {
                        accepted.withLock { $0[id] = current }
                    }
                    current += 1
                }
            }
            // Every fourth round the mode lifts mid-stream: the kill then lands among deliveries too.
            let lifetime = Double.random(in: 0.1...0.6, using: &generator)
            if round % 4 == 3 {
                Thread.sleep(forTimeInterval: lifetime / 2)
                _ = try? admin.put("/mode", #"{"mode": "normal"}"#)
                Thread.sleep(forTimeInterval: lifetime / 2)
            } else {
                Thread.sleep(forTimeInterval: lifetime)
            }
            proxy.signal(SIGKILL)
            #expect(proxy.waitForExit(timeout: 10) == SIGKILL)
            kills += 1
            stop.store(true, ordering: .releasing)
            _ = AdminPolling.until(timeout: .seconds(10)) { done.load(ordering: .acquiring) }
        }
        #expect(kills == 50)
        let ids = accepted.withLock { $0 }
        #expect(ids.count > 50, "uploads answered 202 across the rounds: \(ids.count)")

        let proxy = try ProxyProcess(config: "", arguments: arguments, directory: root)
        defer { halt(proxy) }
        let admin = AdminAPIClient(port: proxy.adminPort)
        #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
        let delivered = AdminPolling.until(timeout: .seconds(120), interval: .milliseconds(200)) {
            let keys = Set(origin.requests.compactMap { $0.values(of: "Idempotency-Key").first })
            return ids.keys.allSatisfy { keys.contains($0) }
        }
        let received = origin.requests
        let keys = received.compactMap { $0.values(of: "Idempotency-Key").first }
        let missing = ids.keys.filter { !keys.contains($0) }
        #expect(delivered && missing.isEmpty, "\(missing.count) of \(ids.count) uploads answered 202 never reached the origin")
        var seedByKey: [String: String] = [:]
        var duplicates = 0
        var live = 0
        for request in received {
            let seedText = try #require(request.values(of: "X-Seed").first)
            guard let key = request.values(of: "Idempotency-Key").first else {
                // Sent while a round had lifted the mode: forwarded at once, never stored.
                live += 1
                continue
            }
            if let earlier = seedByKey[key] {
                duplicates += 1
                #expect(earlier == seedText, "a key names one upload")
            }
            seedByKey[key] = seedText
            let seedValue = try #require(UInt64(seedText))
            if let expected = ids[key] { #expect(expected == seedValue, "the 202's id names this upload") }
            let size = min(SeededUploadBody.size(seed: seedValue), 512 << 10)
            #expect(request.payload == SeededUploadBody.bytes(seed: seedValue, count: size), "byte for byte, seed \(seedValue)")
        }
        print("[measure] 50 SIGKILLs: \(ids.count) uploads answered 202, \(received.count - live) deliveries seen, "
              + "\(duplicates) duplicates (same Idempotency-Key), \(Set(keys).count - ids.count) stored without their 202, "
              + "\(live) forwarded live while the mode was lifted")
    }
}
