@testable import DatamodeDeferral
import DatamodeTestSupport
import Foundation
import Testing

/// Crash safety proven, not assumed (SPEC §18.3: "once 202 is sent the upload survives SIGKILL").
///
/// A child process (`DatamodeDeferralProbe crash-child`) enqueues bodies in a loop, three in flight, taking some to
/// `delivering` on the way, and appends `A <id> <seed>` to a file after each enqueue's completion (the commit) and
/// `B <seed>` before it. The test SIGKILLs it at a random moment, 50 times, and after each kill opens the store
/// and checks:
/// - it opens cleanly (no error, no damage);
/// - every acknowledged upload is there, `queued`, with exactly the bytes enqueued;
/// - every entry there, acknowledged or not, is whole: its body is exactly the one of its seed (never a part);
/// - nothing is left `delivering` (the open put it back to `queued`), and the totals match the entries.
/// Then it cancels and purges everything (the next round starts empty, and must not see any of it again).
@Suite("Deferred store: SIGKILL", .serialized)
struct CrashTests {
    static let rounds = 50

    /// The probe binary: `DATAMODE_DEFERRAL_PROBE_BIN`, else beside the running test bundle (`swift build
    /// --build-tests` builds it there).
    static var probePath: String? {
        if let path = ProcessInfo.processInfo.environment["DATAMODE_DEFERRAL_PROBE_BIN"], !path.isEmpty { return path }
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        for _ in 0..<4 {
            let candidate = directory.appendingPathComponent("DatamodeDeferralProbe").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return nil
    }

    /// What the child wrote, line by line (a line without its newline was cut by the kill and is ignored).
    struct Acks {
        var ready = false
        var acknowledged: [(id: String, seed: UInt64)] = []
        var begun: [UInt64] = []
        var refused: [String] = []

        init(path: String) {
            let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            var lines = text.split(separator: "\n", omittingEmptySubsequences: false)
            lines.removeLast()  // empty after a final newline; else a cut line
            for line in lines {
                let parts = line.split(separator: " ")
                switch parts.first {
                case "R": ready = true
                case "B": begun.append(UInt64(parts[1])!)
                case "A": acknowledged.append((String(parts[1]), UInt64(parts[2])!))
                case "F": refused.append(String(line))
                default: break
                }
            }
        }
    }

    @Test("50 SIGKILLs at random moments: every acknowledged upload survives whole, no partial entry is ever seen")
    func killLoop() throws {
        guard let probe = Self.probePath else {
            Issue.record("DatamodeDeferralProbe not found beside the test bundle: build with `swift build --build-tests`")
            return
        }
        let directory = try StoreDirectory()
        defer { directory.remove() }
        var generator = SystemRandomNumberGenerator()
        var figures = (acknowledged: 0, unacknowledgedFound: 0, inFlightAtKill: 0, recovered: 0, roundsRecovering: 0,
                       bytesChecked: 0, maxKillDelay: 0, inFiles: 0, swept: 0)
        for round in 0..<Self.rounds {
            let ackPath = directory.path + "/acks-\(round)"
            let firstSeed = UInt64(round) * 1_000_000
            let child = Process()
            child.executableURL = URL(fileURLWithPath: probe)
            child.arguments = ["crash-child", directory.database, ackPath, "\(firstSeed)"]
            try child.run()
            // Wait for the store to be open (the previous round's kill may have left a WAL to recover).
            let deadline = Date().addingTimeInterval(20)
            while !Acks(path: ackPath).ready && child.isRunning && Date() < deadline { usleep(1000) }
            #expect(Acks(path: ackPath).ready, "round \(round): the child did not open the store")
            let delay = Int.random(in: 0...400, using: &generator)
            figures.maxKillDelay = max(figures.maxKillDelay, delay)
            usleep(useconds_t(delay * 1000))
            kill(child.processIdentifier, SIGKILL)
            child.waitUntilExit()
            #expect(child.terminationReason == .uncaughtSignal, "round \(round): the child exited by itself")

            let acks = Acks(path: ackPath)
            #expect(acks.refused.isEmpty, "round \(round): \(acks.refused)")
            let acknowledgedSeeds = Set(acks.acknowledged.map(\.seed))
            figures.acknowledged += acks.acknowledged.count
            figures.inFlightAtKill += acks.begun.filter { !acknowledgedSeeds.contains($0) }.count

            let db: DeferredDatabase
            do {
                db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits(maxBody: 8 << 20, maxBytes: 1 << 30))
            } catch {
                Issue.record("round \(round): the store did not open after the kill: \(error)")
                return
            }
            figures.recovered += db.recovered
            if db.recovered > 0 { figures.roundsRecovering += 1 }
            figures.swept += db.sweptFiles

            let entries = try db.list(statuses: nil, limit: 100_000)
            let byID = Dictionary(uniqueKeysWithValues: entries.map { ($0.id, $0) })
            for (id, seed) in acks.acknowledged {
                #expect(byID[id] != nil, "round \(round): acknowledged upload \(id) (seed \(seed)) is missing")
            }
            for entry in entries {
                #expect(entry.status == .queued, "round \(round): \(entry.id) is \(entry.status)")
                guard let seedText = entry.headers.first(where: { $0.name == "X-Probe-Seed" })?.value, let seed = UInt64(seedText) else {
                    Issue.record("round \(round): \(entry.id) has no seed header: \(entry.headers)")
                    continue
                }
                #expect(seed >= firstSeed && seed < firstSeed + 1_000_000, "round \(round): \(entry.id) is from another round (seed \(seed))")
                #expect(acks.begun.contains(seed), "round \(round): seed \(seed) was never enqueued")
                if let acknowledged = acks.acknowledged.first(where: { $0.seed == seed }) {
                    #expect(acknowledged.id == entry.id, "round \(round): seed \(seed) stored twice or under another id")
                } else {
                    figures.unacknowledgedFound += 1
                }
                let size = SeededUploadBody.size(seed: seed)
                #expect(entry.bytes == size, "round \(round): \(entry.id) has \(entry.bytes) bytes, seed \(seed) has \(size)")
                let body = try db.body(entry.id)
                #expect(body == SeededUploadBody.bytes(seed: seed, count: size), "round \(round): \(entry.id) (seed \(seed)) has a different body")
                figures.bytesChecked += body.count
                if body.count > DeferredStoreLimits.defaultInlineBody { figures.inFiles += 1 }
                #expect(entry.url == "http://origin-\(seed % 4).example/upload/\(seed)")
            }
            #expect(db.totals == DeferredTotals(entries: entries.count, bytes: UInt64(entries.reduce(0) { $0 + $1.bytes })))
            #expect(try db.countLive() == db.totals)

            // Empty the store for the next round, which must find none of this.
            for entry in entries { _ = try db.cancel(entry.id, now: 0) }
            #expect(try db.purgeFinished(now: 1, keep: 0) == entries.count)
            #expect(db.totals == DeferredTotals(entries: 0, bytes: 0))
        }
        print("CrashTests: \(Self.rounds) SIGKILLs (0-\(figures.maxKillDelay) ms after open): "
            + "\(figures.acknowledged) acknowledged uploads all found whole; \(figures.inFlightAtKill) enqueues in flight at a kill, "
            + "\(figures.unacknowledgedFound) of them committed before it (found whole); \(figures.recovered) deliveries put back "
            + "to queued in \(figures.roundsRecovering) rounds; \(figures.bytesChecked) body bytes compared, "
            + "\(figures.inFiles) of the entries with their body in a file; \(figures.swept) body files without a commit swept")
        #expect(figures.acknowledged > Self.rounds, "too few uploads to prove anything")
        #expect(figures.inFlightAtKill > 0, "no kill landed during an enqueue")
    }
}
