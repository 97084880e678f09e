import DatamodeDeferral
import DatamodeHTTP
import DatamodeTestSupport
#if canImport(Glibc)
import Glibc
#endif

// A DeferredStore driven from its own process, for what a test cannot do in its own:
//
//   DatamodeDeferralProbe crash-child DB ACKFILE FIRST-SEED
//       Enqueues bodies made from seeds FIRST-SEED, FIRST-SEED+1, … forever (three in flight), and takes some of them
//       to `delivering` (and some back to `queued`) on the way, until it is killed. It appends to ACKFILE, each line
//       with one write(2): `R <recovered>` once the store is open, `B <seed>` before each enqueue, `A <id> <seed>`
//       after its completion reported success (the commit), `F <seed> <error>` after a refusal.
//       Tests/DatamodeDeferralTests/CrashTests.swift SIGKILLs it at random moments.
//
//   DatamodeDeferralProbe bench DIR SIZE COUNT [hybrid|inline|file] [raw]
//       Enqueues COUNT bodies of SIZE bytes one after the other in a fresh store in DIR and prints the latency of
//       each enqueue (submit to completion: the commit, and any checkpoint the previous one left for the store
//       thread) as `p50 p90 p99 max mean` in milliseconds, or with `raw` every sample, one per line. The layout of
//       bodies: `hybrid`, the store's (up to 64 KiB in the database, larger in files); `inline`, all in the
//       database; `file`, all in files. bench/deferral-store runs it.
//
//   DatamodeDeferralProbe fill DB SIZE COUNT
//       Enqueues COUNT bodies of SIZE bytes into the store DB (created when missing) and leaves them there.
//
//   DatamodeDeferralProbe open DB
//       Opens an existing store (its quick_check, the body files' check) and prints how long that took in
//       milliseconds, then the live entries and bytes.

func wallMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func fail(_ message: String) -> Never {
    var line = "DatamodeDeferralProbe: \(message)\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    exit(2)
}

/// A counting semaphore.
final class Slots: @unchecked Sendable {
    private let semaphore = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
    init(_ count: UInt32) { sem_init(semaphore, 0, count) }
    func wait() { while sem_wait(semaphore) != 0 && errno == EINTR {} }
    func signal() { sem_post(semaphore) }
}

/// Appends whole lines to a file, one write(2) each, so a kill never leaves half a line.
struct LineFile: Sendable {
    let fd: Int32
    init(path: String) {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 { fail("cannot open \(path)") }
    }
    func write(_ line: String) {
        var text = line + "\n"
        text.withUTF8 { buffer in _ = Glibc.write(fd, buffer.baseAddress, buffer.count) }
    }
}

func openStore(_ path: String, limits: DeferredStoreLimits) -> DeferredStore {
    do {
        return try DeferredStore(path: path, limits: limits)
    } catch {
        fail("\(error)")
    }
}

func crashChild(database: String, ackPath: String, firstSeed: UInt64) -> Never {
    let store = openStore(database, limits: DeferredStoreLimits(maxBody: 8 << 20, maxBytes: 1 << 30))
    let acks = LineFile(path: ackPath)
    acks.write("R \(store.recoveredAtOpen)")
    let slots = Slots(3)
    var seed = firstSeed
    while true {
        slots.wait()
        let size = SeededUploadBody.size(seed: seed)
        var headers = [HTTPField(name: "Content-Type", value: "application/octet-stream"),
                       HTTPField(name: "X-Probe-Seed", value: "\(seed)")]
        if seed % 3 == 0 { headers.append(HTTPField(name: "Idempotency-Key", value: "probe-\(seed)")) }
        let upload = DeferredUpload(method: seed % 2 == 0 ? "POST" : "PUT", url: "http://origin-\(seed % 4).example/upload/\(seed)",
                                    headers: headers, body: SeededUploadBody.bytes(seed: seed, count: size))
        acks.write("B \(seed)")
        let current = seed
        store.enqueue(upload, now: wallMilliseconds()) { result in
            switch result {
            case .success(let entry): acks.write("A \(entry.id) \(current)")
            case .failure(let error): acks.write("F \(current) \(error)")
            }
            slots.signal()
        }
        // Deliveries in flight when the kill comes: the next open must put them back to `queued`.
        if seed % 5 == 0 {
            store.nextDue(now: wallMilliseconds(), concurrency: 2, limit: 2) { result in
                for entry in (try? result.get()) ?? [] {
                    store.markDelivering(entry.id, now: wallMilliseconds()) { started in
                        guard case .success = started, current % 10 == 0 else { return }
                        store.markRetry(entry.id, error: "probe retry", originStatus: 503, now: wallMilliseconds()) { _ in }
                    }
                }
            }
        }
        seed += 1
    }
}

func bench(directory: String, size: Int, count: Int, layout: String, raw: Bool) -> Never {
    let path = directory + "/bench-\(layout)-\(size).sqlite"
    let inline = layout == "inline" ? Int.max : layout == "file" ? 0 : DeferredStoreLimits.defaultInlineBody
    let store = openStore(path, limits: DeferredStoreLimits(maxBody: max(size, 1), maxBytes: 1 << 40, inlineBody: inline))
    let body = SeededUploadBody.bytes(seed: UInt64(size), count: size)
    let done = Slots(0)
    var samples: [Double] = []
    var ids: [String] = []
    for _ in 0..<count {
        let start = monotonicNanoseconds()
        let upload = DeferredUpload(method: "POST", url: "http://bench.example/upload",
                                    headers: [HTTPField(name: "Content-Type", value: "application/octet-stream")], body: body)
        let id = Box()
        store.enqueue(upload, now: wallMilliseconds()) { result in
            switch result {
            case .success(let entry): id.value = entry.id
            case .failure(let error): fail("enqueue: \(error)")
            }
            done.signal()
        }
        done.wait()
        samples.append(Double(monotonicNanoseconds() - start) / 1_000_000)
        ids.append(id.value)
    }
    // Leave nothing behind: cancel (drops the bodies), purge, close, remove the file.
    for id in ids { store.cancel(id, now: wallMilliseconds()) { _ in } }
    store.purgeFinished(now: wallMilliseconds(), keep: .zero) { _ in }
    store.close()
    unlink(path)
    rmdir(path + "-bodies")
    if raw {
        for sample in samples { print(format3(sample)) }
        exit(0)
    }
    samples.sort()
    func percentile(_ p: Double) -> Double { samples[min(samples.count - 1, Int((p * Double(samples.count)).rounded(.up)) - 1)] }
    let mean = samples.reduce(0, +) / Double(samples.count)
    print([percentile(0.5), percentile(0.9), percentile(0.99), samples.last!, mean].map(format3).joined(separator: " "))
    exit(0)
}

/// A value the completion hands back to the waiting thread (the semaphore orders the two).
final class Box: @unchecked Sendable {
    var value = ""
}

func format3(_ value: Double) -> String {
    let thousandths = Int((value * 1000).rounded())
    let fraction = String(thousandths % 1000)
    return "\(thousandths / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
}

func fill(database: String, size: Int, count: Int) -> Never {
    let store = openStore(database, limits: DeferredStoreLimits(maxBody: max(size, 1), maxBytes: 1 << 40))
    let body = SeededUploadBody.bytes(seed: UInt64(size), count: size)
    let done = Slots(0)
    for _ in 0..<count {
        store.enqueue(DeferredUpload(method: "POST", url: "http://bench.example/upload", headers: [], body: body),
                      now: wallMilliseconds()) { result in
            if case .failure(let error) = result { fail("enqueue: \(error)") }
            done.signal()
        }
        done.wait()
    }
    store.close()
    exit(0)
}

func openTime(database: String) -> Never {
    let start = monotonicNanoseconds()
    let store = openStore(database, limits: DeferredStoreLimits(maxBody: 1 << 29, maxBytes: 1 << 40))
    let elapsed = Double(monotonicNanoseconds() - start) / 1_000_000
    print("\(format3(elapsed)) \(store.totals.entries) \(store.totals.bytes)")
    exit(0)
}

let arguments = CommandLine.arguments
switch arguments.dropFirst().first {
case "crash-child" where arguments.count == 5:
    guard let seed = UInt64(arguments[4]) else { fail("FIRST-SEED must be a number") }
    crashChild(database: arguments[2], ackPath: arguments[3], firstSeed: seed)
case "bench" where (5...7).contains(arguments.count):
    guard let size = Int(arguments[3]), let count = Int(arguments[4]), count > 0 else { fail("SIZE and COUNT must be numbers") }
    let layout = arguments.count >= 6 ? arguments[5] : "hybrid"
    guard ["hybrid", "inline", "file"].contains(layout) else { fail("the layout is hybrid, inline or file") }
    guard arguments.count < 7 || arguments[6] == "raw" else { fail("the last argument is raw or nothing") }
    bench(directory: arguments[2], size: size, count: count, layout: layout, raw: arguments.count == 7)
case "fill" where arguments.count == 5:
    guard let size = Int(arguments[3]), let count = Int(arguments[4]) else { fail("SIZE and COUNT must be numbers") }
    fill(database: arguments[2], size: size, count: count)
case "open" where arguments.count == 3:
    openTime(database: arguments[2])
default:
    fail("usage: crash-child DB ACKFILE FIRST-SEED | bench DIR SIZE COUNT [hybrid|inline|file] [raw] | fill DB SIZE COUNT | open DB")
}
