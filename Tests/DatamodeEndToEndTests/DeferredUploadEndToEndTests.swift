// SPEC §18.3 through the real binary: refused uploads stored (202 only after the commit), delivered byte-exact
// exactly once when their conditions lift, retried after a 5xx, bounded by max-body, max-bytes and max-age,
// cancelled and flushed through the admin API, each session's lifted by its own mode; a corrupt store stops
// start-up naming its file.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Sends `method url` with a binary body through the proxy on `client` and reads the answer.
func upload(_ client: RawHTTPClient, _ url: String, body: [UInt8], method: String = "POST",
            headers: [(String, String)] = [("Allow-Constrained", "?0"), ("Prefer", "respond-async")]) throws -> ParsedResponse {
    var head = "\(method) \(url) HTTP/1.1\r\nHost: \(URL(string: url)!.host!):\(URL(string: url)!.port ?? 80)\r\n"
    for (name, value) in headers { head += "\(name): \(value)\r\n" }
    head += "Content-Length: \(body.count)\r\n\r\n"
    try client.send(Array(head.utf8) + body)
    return try client.readFinalResponse(method: method)
}

/// The JSON object of a response body.
func object(_ response: ParsedResponse) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(response.body))) as? [String: Any] ?? [:]
}

@Suite("Deferred uploads: end to end", .serialized)
struct DeferredUploadEndToEndTests {
    static let stored = [("Allow-Constrained", "?0"), ("Prefer", "respond-async")]

    @Test("0 B, 1 MiB and 64 MiB uploads: 202 after the commit, delivered byte-exact exactly once when the mode lifts")
    func storedAndDelivered() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 70 << 20) { _ in .status(201, "made") }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(60))
            var ids: [String: [UInt8]] = [:]
            for (index, size) in [0, 1 << 20, 64 << 20].enumerated() {
                let body = SeededUploadBody.bytes(seed: UInt64(index + 1), count: size)
                let response = try upload(client, origin.url("/up/\(index)"), body: body,
                                          headers: Self.stored + [("Proxy-Authorization", "Basic c2VjcmV0"),
                                                                  ("X-Photo", "\(index)")])
                #expect(response.status == 202, "\(response.headText)\(response.bodyText)")
                let id = try #require(response.value(of: "Data-Mode-Deferred"))
                #expect(response.value(of: "Preference-Applied") == "respond-async")
                let document = object(response)
                #expect(document["deferred"] as? String == id && document["status"] as? String == "queued")
                #expect(document["url"] as? String == origin.url("/up/\(index)"))
                ids[id] = body
            }
            let listed = try admin.get("/deferred").array ?? []
            #expect(Set(listed.compactMap { $0["id"] as? String }) == Set(ids.keys))
            #expect(listed.allSatisfy { $0["status"] as? String == "queued" })
            Thread.sleep(forTimeInterval: 0.6)
            #expect(origin.requests.isEmpty, "nothing is delivered while the mode refuses it")
            let mode = try FileManager.default.attributesOfItem(atPath: proxy.directory + "/state/deferred.sqlite")
            #expect((mode[.posixPermissions] as? Int) == 0o600)

            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            let received = origin.waitForRequests(3, timeout: .seconds(60))
            try #require(received.count == 3)
            for request in received {
                let key = try #require(request.values(of: "Idempotency-Key").first)
                let body = try #require(ids[key], "Idempotency-Key is the deferred id")
                #expect(request.bodyLength == UInt64(body.count))
                #expect(request.payload == body, "byte-exact, \(body.count) bytes")
                #expect(request.values(of: "Proxy-Authorization").isEmpty && request.values(of: "Prefer").isEmpty)
                #expect(request.values(of: "X-Photo").count == 1)
                #expect(request.method == "POST")
            }
            #expect(AdminPolling.until { (try? admin.get("/deferred").array ?? [])?.allSatisfy { $0["status"] as? String == "delivered" } == true })
            for id in ids.keys {
                let entry = try admin.get("/deferred/\(id)").object
                #expect(entry["status"] as? String == "delivered" && entry["originStatus"] as? Int == 201 && entry["attempts"] as? Int == 1)
            }
            Thread.sleep(forTimeInterval: 1)
            #expect(origin.requests.count == 3, "exactly once")
            let metrics = try MetricsScrape(admin.get("/metrics").bodyText)
            #expect(metrics.value("datamode_deferred_total", ["outcome": "queued"]) == 3)
            #expect(metrics.value("datamode_deferred_total", ["outcome": "delivered"]) == 3)
            #expect(metrics.value("datamode_deferred_queue_entries") == 0)
        }
    }

    @Test("a 5xx origin is retried with backoff, then delivered with the same Idempotency-Key; the client's own key is kept")
    func retriedAfter5xx() throws {
        let answers = Counter()
        let origin = try RecordingOrigin { _ in answers.next() == 0 ? .status(503, "later") : .ok("thanks") }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let response = try upload(client, origin.url("/log"), body: Array("log bundle".utf8),
                                      headers: Self.stored + [("Idempotency-Key", "client-key-1")])
            #expect(response.status == 202)
            let id = try #require(response.value(of: "Data-Mode-Deferred"))
            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            let received = origin.waitForRequests(2, timeout: .seconds(10))
            try #require(received.count == 2)
            #expect(received.map { $0.values(of: "Idempotency-Key") } == [["client-key-1"], ["client-key-1"]])
            #expect(received.allSatisfy { $0.bodyText == "log bundle" })
            #expect(AdminPolling.until { (try? admin.get("/deferred/\(id)").object["status"] as? String) == "delivered" })
            let entry = try admin.get("/deferred/\(id)").object
            #expect(entry["attempts"] as? Int == 2 && entry["originStatus"] as? Int == 200)
        }
    }

    @Test("an origin that answers 413 before reading the upload and closes: delivered with 413, not sent again")
    func anEarlyFinalAnswerEndsTheUpload() throws {
        // The origin answers at once and closes with the body unread: the proxy's send fails, but the answer is
        // there to read. SPEC §18.3: a 4xx is final.
        let origin = try EarlyAnswerOrigin(answer: "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(30))
            let body = SeededUploadBody.bytes(seed: 7, count: 3 << 20)
            let response = try upload(client, origin.url("/photos"), body: body)
            #expect(response.status == 202, "\(response.headText)\(response.bodyText)")
            let id = try #require(response.value(of: "Data-Mode-Deferred"))
            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            #expect(AdminPolling.until(timeout: .seconds(10)) {
                (try? admin.get("/deferred/\(id)").object["status"] as? String) == "delivered"
            }, "\((try? admin.get("/deferred/\(id)").object) ?? [:])")
            let entry = try admin.get("/deferred/\(id)").object
            #expect(entry["originStatus"] as? Int == 413 && entry["attempts"] as? Int == 1, "\(entry)")
            // A retry would come after 1 s of backoff.
            Thread.sleep(forTimeInterval: 2)
            #expect(origin.connections == 1)
        }
    }

    @Test("max-body and max-bytes: the usual refusal, with \"deferral\": \"full\" when the queue is full; uploads globs")
    func bounds() throws {
        let config = """
            mode: constrained
            deferral: {max-body: 2KiB, max-bytes: 3KiB, uploads: ["http://127.0.0.1:*/sync/*"]}
            """
        try withAdminProxy(config: config) { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let tooLarge = try upload(client, "http://127.0.0.1:9/up", body: [UInt8](repeating: 1, count: 3000))
            #expect(tooLarge.status == 403 && tooLarge.problem?.error == "constrained", "\(tooLarge.bodyText)")
            #expect(!tooLarge.bodyText.contains("deferral"))
            // Chunked, so its size is known only once read: refused all the same, the connection still usable.
            var chunked = "POST http://127.0.0.1:9/up HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAllow-Constrained: ?0\r\n"
            chunked += "Prefer: respond-async\r\nTransfer-Encoding: chunked\r\n\r\n"
            chunked += "bb8\r\n" + String(repeating: "c", count: 3000) + "\r\n0\r\n\r\n"
            try client.send(chunked)
            #expect(try client.readFinalResponse(method: "POST").status == 403)

            let first = try upload(client, "http://127.0.0.1:9/up", body: [UInt8](repeating: 2, count: 2000))
            #expect(first.status == 202)
            let full = try upload(client, "http://127.0.0.1:9/up", body: [UInt8](repeating: 3, count: 2000))
            #expect(full.status == 403, "\(full.bodyText)")
            #expect(object(full)["deferral"] as? String == "full")
            #expect(full.problem?.error == "constrained")
            // A URL in deferral.uploads is stored without Prefer.
            let globbed = try upload(client, "http://127.0.0.1:9/sync/a", body: Array("x".utf8),
                                     headers: [("Allow-Constrained", "?0")])
            #expect(globbed.status == 202)
            let other = try upload(client, "http://127.0.0.1:9/other", body: Array("x".utf8), headers: [("Allow-Constrained", "?0")])
            #expect(other.status == 403)
            #expect(try MetricsScrape(admin.get("/metrics").bodyText).value("datamode_deferred_total", ["outcome": "full"]) == 1)
            #expect(try proxied(client, "http://127.0.0.1:9/next", headers: [("Allow-Constrained", "?0")]).status == 403,
                    "the connection goes on")
        }
    }

    /// A chunked upload is its payload: the chunk framing belongs to the client's hop. It used to be stored with its
    /// framing and delivered with a `Content-Length` counting it, so the origin got `3e8\r\n…\r\n0\r\n\r\n` as the
    /// body (and `max-body` counted the framing: a body of exactly `max-body` was refused).
    @Test("a chunked upload is stored and delivered as its payload, and max-body counts the payload alone")
    func chunkedUploadIsItsPayload() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\ndeferral: {max-body: 3000}\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let body = SeededUploadBody.bytes(seed: 7, count: 3000)
            var request = Array("POST \(origin.url("/chunked")) HTTP/1.1\r\nHost: 127.0.0.1:\(origin.port)\r\n".utf8)
            request += Array("Allow-Constrained: ?0\r\nPrefer: respond-async\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
            for start in stride(from: 0, to: body.count, by: 1000) {
                request += Array("3e8;ext=1\r\n".utf8) + body[start..<start + 1000] + Array("\r\n".utf8)
            }
            request += Array("0\r\nX-Trailer: t\r\n\r\n".utf8)
            try client.send(request)
            let response = try client.readFinalResponse(method: "POST")
            #expect(response.status == 202, "a body of exactly max-body is stored: \(response.headText)\(response.bodyText)")
            let id = try #require(response.value(of: "Data-Mode-Deferred"))
            #expect(try admin.get("/deferred/\(id)").object["bytes"] as? Int == 3000)
            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            let received = origin.waitForRequests(1, timeout: .seconds(10))
            try #require(received.count == 1)
            #expect(received[0].values(of: "Content-Length") == ["3000"])
            #expect(received[0].payload == body, "byte-exact: \(received[0].bodyLength) bytes arrived")
        }
    }

    /// SPEC §6: a body is never buffered whole, and a stored upload is no exception. The intake used to hold each
    /// body in memory until its commit, as many as were arriving: 8 concurrent 60 MB uploads peaked at 504 MB resident
    /// (review15 `repro/deferral_memory.sh`). Past `inlineBody` a body now goes to its file as it arrives, at most
    /// `DeferralIntake.window` bytes per upload on their way to the store, the client read no faster than the store
    /// writes: the proxy's peak resident set grows by a small part of the bodies' sum. Each is still delivered
    /// byte-exact, with its Idempotency-Key.
    @Test("6 concurrent 40 MB uploads are stored as they arrive: the proxy's peak RSS grows far less than their sum")
    func concurrentLargeUploadsAreNotHeldInMemory() throws {
        let size = 40 << 20
        let count = 6
        let origin = try RecordingOrigin(maxRecordedBodyBytes: size + 1) { _ in .status(201, "made") }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\n") { proxy, admin in
            let pid = proxy.process.processIdentifier
            let before = try #require(ProcessProbe.peakResidentKiB(pid))
            let bodies = (0..<count).map { SeededUploadBody.bytes(seed: UInt64(100 + $0), count: size) }
            let answers = Mutex<[Int: Result<ParsedResponse, any Error>]>([:])
            // Threads of their own: all six uploads arrive at once (a dispatch pool would run two on two cores).
            let threads = (0..<count).map { index in
                Thread {
                    let result = Result { () throws -> ParsedResponse in
                        let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(120))
                        return try upload(client, origin.url("/big/\(index)"), body: bodies[index])
                    }
                    answers.withLock { $0[index] = result }
                }
            }
            threads.forEach { $0.start() }
            #expect(AdminPolling.until(timeout: .seconds(180), interval: .milliseconds(50)) { answers.withLock { $0.count } == count })
            var ids: [String: Int] = [:]
            for index in 0..<count {
                let response = try #require(try answers.withLock { $0[index] }?.get())
                #expect(response.status == 202, "\(response.headText)\(response.bodyText)")
                ids[try #require(response.value(of: "Data-Mode-Deferred"))] = index
            }
            let stored = try #require(ProcessProbe.peakResidentKiB(pid))
            // The bodies' sum is 240 MiB; held whole they showed in full.
            #expect(stored - before < 100 << 10, "peak RSS grew by \((stored - before) >> 10) MiB storing \(count) × 40 MiB")

            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            let received = origin.waitForRequests(count, timeout: .seconds(180))
            try #require(received.count == count)
            for request in received {
                let key = try #require(request.values(of: "Idempotency-Key").first)
                let index = try #require(ids[key], "Idempotency-Key is the deferred id")
                #expect(request.bodyLength == UInt64(size))
                #expect(request.payload == bodies[index], "byte-exact, upload \(index)")
            }
            #expect(AdminPolling.until(timeout: .seconds(30)) {
                (try? admin.get("/deferred").array ?? [])?.allSatisfy { $0["status"] as? String == "delivered" } == true
            })
            let delivered = try #require(ProcessProbe.peakResidentKiB(pid))
            #expect(delivered - before < 100 << 10, "peak RSS grew by \((delivered - before) >> 10) MiB with the deliveries")
            print("deferral memory: peak RSS \(before >> 10) MiB at start, \(stored >> 10) MiB stored, \(delivered >> 10) MiB delivered")
        }
    }

    /// Past `inlineBody` a body is written to its file as it arrives: one that passes `max-body` midway (chunked, so
    /// its size is known only as it comes) gets the usual refusal, what was written of it is removed and the
    /// connection goes on; a client that leaves midway leaves no file behind either, and nothing queued; one that would pass `max-bytes`
    /// is refused as full before it ends.
    @Test("a streamed upload past max-body midway is refused and its partial file removed; so is one whose client leaves")
    func streamedUploadEndedMidway() throws {
        try withAdminProxy(config: "mode: constrained\ndeferral: {max-body: 1MiB, max-bytes: 1536KiB}\n") { proxy, admin in
            let files = proxy.stateDirectory + "/deferred.sqlite-bodies"
            let listed = { (try? FileManager.default.contentsOfDirectory(atPath: files)) ?? [] }
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(30))
            var request = Array("POST http://127.0.0.1:9/big HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAllow-Constrained: ?0\r\n".utf8)
            request += Array("Prefer: respond-async\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
            let chunk = SeededUploadBody.bytes(seed: 11, count: 64 << 10)
            for _ in 0..<32 { request += Array("10000\r\n".utf8) + chunk + Array("\r\n".utf8) }
            request += Array("0\r\n\r\n".utf8)
            try client.send(request)
            let refused = try client.readFinalResponse(method: "POST")
            #expect(refused.status == 403 && refused.problem?.error == "constrained", "\(refused.headText)\(refused.bodyText)")
            #expect(!refused.bodyText.contains("deferral"))
            #expect(AdminPolling.until { listed().isEmpty }, "the partial body file is removed: \(listed())")
            #expect(try proxied(client, "http://127.0.0.1:9/next", headers: [("Allow-Constrained", "?0")]).status == 403,
                    "the connection goes on")

            let leaving = try RawHTTPClient(port: proxy.port, timeout: .seconds(30))
            var head = "POST http://127.0.0.1:9/left HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAllow-Constrained: ?0\r\n"
            head += "Prefer: respond-async\r\nContent-Length: \(1 << 20)\r\n\r\n"
            try leaving.send(Array(head.utf8) + SeededUploadBody.bytes(seed: 12, count: 512 << 10))
            #expect(AdminPolling.until { listed().count == 1 }, "half the body is in its file: \(listed())")
            leaving.close()
            #expect(AdminPolling.until { listed().isEmpty }, "the client left: its partial file is removed: \(listed())")
            #expect(try admin.get("/deferred").array?.isEmpty == true)

            // max-bytes is known midway too: the queue holds 900 KiB, the next 900 KiB would pass 1.5 MiB.
            let stored = try upload(client, "http://127.0.0.1:9/first", body: SeededUploadBody.bytes(seed: 13, count: 900 << 10))
            #expect(stored.status == 202)
            let full = try upload(client, "http://127.0.0.1:9/second", body: SeededUploadBody.bytes(seed: 14, count: 900 << 10))
            #expect(full.status == 403 && object(full)["deferral"] as? String == "full", "\(full.headText)\(full.bodyText)")
            #expect(AdminPolling.until { listed().count == 1 }, "only the stored upload's file is left: \(listed())")
            #expect(try admin.get("/deferred").array?.count == 1)
        }
    }

    @Test("max-age expires an upload; DELETE cancels one; POST /deferred/flush delivers whatever the mode")
    func expireCancelFlush() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\ndeferral: {max-age: 2s}\n") { proxy, admin in
            let stream = try EventStreamClient(port: proxy.adminPort)
            defer { stream.close() }
            _ = try stream.next("mode")
            let client = try RawHTTPClient(port: proxy.port)
            let expiring = try #require(try upload(client, origin.url("/old"), body: Array("old".utf8)).value(of: "Data-Mode-Deferred"))
            #expect(try stream.next("deferred").object["outcome"] as? String == "queued")
            #expect(try stream.next("deferred").object["outcome"] as? String == "expired")
            #expect(try admin.get("/deferred/\(expiring)").object["status"] as? String == "expired")

            let cancelled = try #require(try upload(client, origin.url("/cancel"), body: Array("c".utf8)).value(of: "Data-Mode-Deferred"))
            let flushed = try #require(try upload(client, origin.url("/flush"), body: Array("f".utf8)).value(of: "Data-Mode-Deferred"))
            let cancel = try admin.delete("/deferred/\(cancelled)")
            #expect(cancel.status == 200 && cancel.object["status"] as? String == "cancelled")
            #expect(try admin.delete("/deferred/\(cancelled)").status == 409, "cancelled already")
            #expect(try admin.get("/deferred/nope").status == 404)
            #expect(try admin.request("POST", "/deferred/flush").status == 202)
            let received = origin.waitForRequests(1, timeout: .seconds(10))
            #expect(received.map(\.target) == ["/flush"])
            #expect(AdminPolling.until { (try? admin.get("/deferred/\(flushed)").object["status"] as? String) == "delivered" })
            Thread.sleep(forTimeInterval: 0.5)
            #expect(origin.requests.count == 1, "neither the expired nor the cancelled upload is delivered")
        }
    }

    /// A flush is for every upload queued when it is asked for, not one pass's worth: `concurrency` still bounds how
    /// many are sent at once, and the rest follow as those end. It used to start one pass (`concurrency` per origin)
    /// and leave the others queued for as long as the mode refused them, while answering `{"flushing": 5}`.
    @Test("POST /deferred/flush delivers every queued upload, more than concurrency, while the mode still refuses them")
    func flushDeliversBeyondConcurrency() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\ndeferral: {concurrency: 1}\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            for index in 0..<5 {
                #expect(try upload(client, origin.url("/flush/\(index)"), body: Array("upload \(index)".utf8)).status == 202)
            }
            let flush = try admin.request("POST", "/deferred/flush")
            #expect(flush.status == 202 && flush.object["flushing"] as? Int == 5)
            let received = origin.waitForRequests(5, timeout: .seconds(10))
            #expect(received.map(\.target) == (0..<5).map { "/flush/\($0)" }, "oldest first, one at a time")
            #expect(AdminPolling.until { (try? admin.get("/deferred").array ?? [])?.allSatisfy { $0["status"] as? String == "delivered" } == true })
            // An upload stored after the flush waits for the mode, as before.
            #expect(try upload(client, origin.url("/later"), body: Array("later".utf8)).status == 202)
            Thread.sleep(forTimeInterval: 0.8)
            #expect(origin.requests.count == 5, "the flush was for what was queued when it was asked for")
        }
    }

    @Test("sessions: a session's mode lifts only its own uploads")
    func sessions() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\nsessions: {enabled: true}\n") { proxy, admin in
            #expect(try admin.put("/sessions/a", #"{"mode": "constrained"}"#).status == 201)
            #expect(try admin.put("/sessions/b", #"{"mode": "constrained"}"#).status == 201)
            let client = try RawHTTPClient(port: proxy.port)
            let a = try upload(client, origin.url("/a"), body: Array("a".utf8), headers: Self.stored + [("Data-Mode-Session", "a")])
            let b = try upload(client, origin.url("/b"), body: Array("b".utf8), headers: Self.stored + [("Data-Mode-Session", "b")])
            #expect(a.status == 202 && b.status == 202)
            #expect(try admin.put("/sessions/a", #"{"mode": "normal"}"#).status == 200)
            #expect(origin.waitForRequests(1, timeout: .seconds(10)).map(\.target) == ["/a"])
            #expect(origin.requests.first?.values(of: "Data-Mode-Session").isEmpty == true)
            Thread.sleep(forTimeInterval: 0.8)
            #expect(origin.requests.count == 1, "b's session is still constrained (and so is the global mode)")
            let bID = try #require(b.value(of: "Data-Mode-Deferred"))
            #expect(try admin.get("/deferred/\(bID)").object["status"] as? String == "queued")
            #expect(try admin.get("/deferred/\(bID)").object["session"] as? String == "b")
        }
    }

    @Test("a corrupt store stops start-up with an error naming the file")
    func corruptStore() throws {
        let directory = try ScratchDirectory.make("deferral-corrupt")
        defer { ScratchDirectory.remove(directory) }
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
        let path = directory + "/state/deferred.sqlite"
        try Data(repeating: 0x5a, count: 8192).write(to: URL(fileURLWithPath: path))
        try "".write(toFile: directory + "/datamode.yaml", atomically: true, encoding: .utf8)
        let result = try ProxyProcess.runCLI(["run", "--config", directory + "/datamode.yaml", "--listen", "127.0.0.1:0",
                                              "--admin-listen", "127.0.0.1:0", "--state-dir", directory + "/state"])
        #expect(result.status != 0)
        #expect(result.stderr.contains(path), "\(result.stderr)")
    }
}

/// Counts calls from the origin's threads.
final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0
    func next() -> Int {
        lock.lock()
        defer { lock.unlock() }
        value += 1
        return value - 1
    }
}
