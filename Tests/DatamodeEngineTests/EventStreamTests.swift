// The admin event stream (SPEC §12) over real sockets, in process: events as they happen, the session filter,
// the heartbeat, a subscriber that stops reading is dropped while one that reads keeps everything, and many
// subscribers at once.
import DatamodeEngine
import DatamodeInstance
import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

@Suite("Event stream: GET /events", .serialized)
struct EventStreamTests {
    @Test("current mode first; mode, variants and reload events as they happen; heartbeat comments")
    func eventsAsTheyHappen() throws {
        let harness = try ProxyHarness(yaml: "sessions: {enabled: true}\n", eventHeartbeat: .milliseconds(300))
        defer { harness.stop() }
        let admin = harness.admin()
        let stream = try EventStreamClient(port: harness.adminPort)
        defer { stream.close() }
        #expect(stream.headText.lowercased().contains("content-type: text/event-stream"))
        let first = try stream.next()
        #expect(first.type == "mode")
        #expect(first.object["scope"] as? String == "global" && first.object["mode"] as? String == "normal")

        #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
        let flipped = try stream.next("mode")
        #expect(flipped.object["mode"] as? String == "constrained" && flipped.object["source"] as? String == "api")
        #expect((flipped.id ?? 0) > (first.id ?? 0))
        #expect(try admin.put("/variants/v1", #"{"match": "http://a/x", "target": "http://a/y"}"#).status == 201)
        #expect(try stream.next("variants").object["changed"] as? String == "v1")
        if case .refused(let reason) = harness.reload(yaml: "sessions: {enabled: true}\n") { Issue.record("reload refused: \(reason)") }
        #expect(try stream.next("reload").object["generation"] is Int)
        #expect(try stream.next("comment").data == "heartbeat")
    }

    @Test("?session=S follows that session only")
    func sessionFilter() throws {
        let harness = try ProxyHarness(yaml: "sessions: {enabled: true}\n")
        defer { harness.stop() }
        let admin = harness.admin()
        #expect(try admin.put("/sessions/s1", #"{"mode": "expensive"}"#).status == 201)
        let stream = try EventStreamClient(port: harness.adminPort, path: "/events?session=s1")
        defer { stream.close() }
        let first = try stream.next()
        #expect(first.object["scope"] as? String == "s1" && first.object["mode"] as? String == "expensive")
        #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(try admin.put("/sessions/s1", #"{"mode": "normal"}"#).status == 200)
        let next = try stream.next()
        #expect(next.type == "mode" && next.object["scope"] as? String == "s1" && next.object["mode"] as? String == "normal",
                "the global flip was not sent to this stream")
    }

    @Test("a subscriber that stops reading is dropped; one that reads gets every event; the proxy serves on")
    func slowSubscriberDropped() throws {
        let harness = try ProxyHarness(yaml: "sessions: {enabled: true}\n")
        defer { harness.stop() }
        let admin = harness.admin()
        let stalled = try EventStreamClient(port: harness.adminPort, receiveBuffer: 4096)
        defer { stalled.close() }
        _ = try stalled.next()
        let reader = try EventStreamClient(port: harness.adminPort)
        defer { reader.close() }
        _ = try reader.next()
        // Session mode flips (in memory: a global PUT /mode is fsynced), pipelined on one admin connection.
        let flips = 2000
        let received = Thread.detachedResult { () throws -> Int in
            var count = 0
            while count < flips { if try reader.next().type == "mode" { count += 1 } }
            return count
        }
        let pipeline = try RawHTTPClient(port: harness.adminPort, timeout: .seconds(60))
        defer { pipeline.close() }
        var burst = ""
        for i in 0..<flips {
            let body = i % 2 == 0 ? #"{"mode": "constrained"}"# : #"{"mode": "normal"}"#
            burst += "PUT /sessions/flip HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        }
        let sent = pipeline.sendInBackground(Array(burst.utf8))
        for i in 0..<flips { #expect(try pipeline.readFinalResponse(method: "PUT").status == (i == 0 ? 201 : 200)) }
        try sent()
        #expect(try received.wait(timeout: 60) == flips, "the reading subscriber got every event")
        // The stalled one was closed once its backlog passed the limit: after what is buffered, EOF.
        let end = Result { while true { _ = try stalled.next() } }
        #expect(throws: (any Error).self) { try end.get() }
        #expect(stalled.connection.isClosedByPeer(within: .seconds(5)))
        #expect(try admin.get("/mode").status == 200)
    }

    /// Issue 24: 500 subscribers that never read took ~350 KB each although the limit is 64 KiB, because each
    /// ~200-byte event went out as its own chunk in a 1 KiB evbuffer chain and only the payload was counted.
    @Test("what the proxy holds for a subscriber that never reads stays within the limit; dropped, it holds nothing")
    func stalledSubscriberBacklogIsBounded() throws {
        let harness = try ProxyHarness(yaml: "sessions: {enabled: true}\n")
        defer { harness.stop() }
        let stalled = try EventStreamClient(port: harness.adminPort, receiveBuffer: 4096)
        defer { stalled.close() }
        _ = try stalled.next()
        // One change at a time (session flips: in memory, no fsync), and what the proxy holds read after each. The
        // events add up to ~600 KB, several times what the two sockets' buffers and the limit can take.
        let admin = try RawHTTPClient(port: harness.adminPort, timeout: .seconds(30))
        defer { admin.close() }
        var largest = 0
        for i in 0..<3000 {
            let body = i % 2 == 0 ? #"{"mode": "constrained"}"# : #"{"mode": "normal"}"#
            try admin.send("PUT /sessions/flip HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
            _ = try admin.readFinalResponse(method: "PUT")
            largest = max(largest, harness.instance.eventBacklogBytes)
        }
        #expect(largest > 0, "the stream did fall behind")
        #expect(largest <= AdminTransport.subscriberBacklogLimit,
                "held \(largest) bytes for one stream; the limit is \(AdminTransport.subscriberBacklogLimit)")
        // Dropped: after what reached its socket, EOF; and the proxy holds nothing for it any more.
        let end = Result { while true { _ = try stalled.next() } }
        #expect(throws: (any Error).self) { try end.get() }
        #expect(stalled.connection.isClosedByPeer(within: .seconds(5)))
        let deadline = ContinuousClock.now + .seconds(5)
        while harness.instance.eventBacklogBytes != 0 && ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.01) }
        #expect(harness.instance.eventBacklogBytes == 0)
    }

    @Test("a thousand subscribers: each gets the flip")
    func manySubscribers() throws {
        let harness = try ProxyHarness()
        defer { harness.stop() }
        #expect(DescriptorLimit.raise(to: 4096) >= 2200, "two descriptors per subscriber (both ends in this process)")
        var streams: [EventStreamClient] = []
        defer { streams.forEach { $0.close() } }
        for _ in 0..<1000 {
            let stream = try EventStreamClient(port: harness.adminPort)
            _ = try stream.next()
            streams.append(stream)
        }
        #expect(try harness.admin().put("/mode", #"{"mode": "expensive"}"#).status == 200)
        for stream in streams { #expect(try stream.next("mode").object["mode"] as? String == "expensive") }
    }
}

extension Thread {
    /// Runs `body` on a new thread; `wait` returns its result.
    static func detachedResult<T: Sendable>(_ body: @escaping @Sendable () throws -> T) -> DetachedResult<T> {
        let result = DetachedResult<T>()
        Thread.detachNewThread { result.set(Result { try body() }) }
        return result
    }
}

final class DetachedResult<T: Sendable>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var value: Result<T, any Error>?
    func set(_ result: Result<T, any Error>) {
        lock.lock(); value = result; lock.unlock()
        done.signal()
    }
    func wait(timeout seconds: Double) throws -> T {
        guard done.wait(timeout: .now() + seconds) == .success else { throw TestSocketError.protocolError("timed out") }
        lock.lock(); defer { lock.unlock() }
        return try value!.get()
    }
}
