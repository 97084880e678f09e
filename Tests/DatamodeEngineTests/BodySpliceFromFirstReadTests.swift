import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// A Content-Length body of 64 KiB or more is spliced from its first bytes on (issue 31: the 100 KiB row). The
/// first read of a response stops at 4 KiB; its head is read before anything more, so the rest of the body stays in
/// the origin's socket and moves kernel to kernel, through a pipe kept between responses (`PipePool`), without an
/// event when its bytes are there already. These tests hold the bytes and the framing to account on every edge of
/// that path: heads shorter and longer than the first read, bodies just below and above the threshold, bodies that
/// arrive in parts, pipelined requests behind a spliced body, a relay stopped with bytes in its pipe.
@Suite struct BodySpliceFromFirstReadTests {
    /// The response to `/<pad>/<size>/<seed>`: `size` pattern bytes after a head padded with a `pad`-byte field,
    /// written in one send (as nginx writes a file's head and first bytes).
    static func origin() throws -> RecordingOrigin {
        try RecordingOrigin { request in
            let parts = request.target.split(separator: "/").suffix(3).compactMap { Int($0) }
            guard parts.count == 3 else { return .status(404) }
            let pattern = PatternBody(length: UInt64(parts[1]), seed: UInt64(parts[2]))
            let fields = parts[0] > 0 ? [HTTPField(name: "X-Pad", value: String(repeating: "p", count: parts[0]))] : []
            return .respond(status: 200, headers: fields, body: pattern.bytes)
        }
    }

    static func fetch(_ client: RawHTTPClient, _ origin: RecordingOrigin, pad: Int, size: Int, seed: Int,
                      _ comment: Comment) throws {
        try client.send(RequestText.make("GET", origin.url("/\(pad)/\(size)/\(seed)")))
        var received = StreamChecksum()
        let response = try client.readResponse(bodySink: { received.update($0) })
        let pattern = PatternBody(length: UInt64(size), seed: UInt64(seed))
        #expect(response.status == 200, comment)
        #expect(response.headers.first { $0.name.lowercased() == "content-length" }?.value == String(size), comment)
        #expect(received.length == UInt64(size), comment)
        #expect(received.value == pattern.checksum, comment)
    }

    /// Failed first: with the 1 MiB threshold and the bulk read taking the whole body before its head was read, no
    /// body of this size was ever spliced.
    @Test func everyBodyFromSixtyFourKiBOnIsSplicedAndArrivesWhole() throws {
        let origin = try Self.origin()
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        let sizes = [100 << 10, 1024, (64 << 10) + 4096, 300 << 10, (64 << 10) - 1, 100 << 10, 0, 2 << 20, 100 << 10]
        for (index, size) in sizes.enumerated() {
            try Self.fetch(client, origin, pad: 0, size: size, seed: index, "body \(index), \(size) bytes")
        }
        // A body at least 4 KiB over the threshold qualifies whatever the first read took of it; one below never.
        let qualifying = sizes.filter { $0 >= (64 << 10) + 4096 }.count
        #expect(proxy.server.metrics().bodySplices == qualifying)
        #expect(origin.connectionCount == 1, "the origin connection carried every exchange")
    }

    /// Found by the client kit's tests (its Linux URLProtocol kept only the last piece of a body: fixed too): a
    /// response not spliced whose head the first read took is read on in the same callback, even when the head and
    /// the body's first bytes emptied the input; the rest of a 5,000-byte response used to wait for the next
    /// readiness and reach the client in a second write. Each response here is sent in one write, so it takes one
    /// read callback (a tenth more allowed for a response the kernel delivered in two parts).
    @Test func aResponseSentInOneWriteIsReadInOneCallback() throws {
        let origin = try Self.origin()
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        let sizes = [4_029, 4_030, 5_000, 8_000, 20_000, (64 << 10) + 1_000]
        let before = proxy.server.metrics().upstreamReadCallbacks
        var exchanges = 0
        for round in 0..<10 {
            for size in sizes {
                try Self.fetch(client, origin, pad: 0, size: size, seed: round, "round \(round), \(size) bytes")
                exchanges += 1
            }
        }
        let callbacks = proxy.server.metrics().upstreamReadCallbacks - before
        #expect(callbacks >= exchanges)
        #expect(callbacks <= exchanges + exchanges / 10, "\(callbacks) read callbacks for \(exchanges) responses")
    }

    /// Heads that end before, at and after the first read's 4 KiB (a head longer than the read is read on; its body
    /// then goes as it may), each followed by bodies on both sides of the threshold.
    @Test func headsOfEveryLengthAroundTheFirstReadKeepTheirBodiesWhole() throws {
        let origin = try Self.origin()
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        var seed = 0
        for pad in [0, 3_900, 3_990, 4_020, 4_050, 4_070, 4_100, 6_000, 12_000, 30_000] {
            for size in [(64 << 10) - 1, 64 << 10, 100 << 10, 1 << 20] {
                seed += 1
                try Self.fetch(client, origin, pad: pad, size: size, seed: seed, "pad \(pad), \(size) bytes")
            }
        }
        #expect(proxy.server.metrics().bodySplices > 0)
        #expect(origin.connectionCount == 1)
    }

    /// A body that reaches the proxy in parts: the relay moves what is there, waits for the rest on an event, and
    /// the connection carries the next exchange. Also with the rest arriving after the head alone.
    @Test(arguments: [1, 4096, 30_000])
    func aBodyArrivingInPartsIsSplicedWhole(firstBodyBytes: Int) throws {
        let size = 200 << 10
        let pattern = PatternBody(length: UInt64(size), seed: UInt64(firstBodyBytes))
        let body = pattern.bytes
        let head = Array("HTTP/1.1 200 OK\r\nContent-Length: \(size)\r\n\r\n".utf8)
        let origin = try RecordingOrigin { request in
            guard request.target.hasSuffix("/parts") else { return .ok("after") }
            let cuts = [firstBodyBytes, firstBodyBytes + 70_000, size]
            var pieces = [head + body[0..<cuts[0]]]
            pieces.append(Array(body[cuts[0]..<cuts[1]]))
            pieces.append(Array(body[cuts[1]..<cuts[2]]))
            return .pieces(pieces, pause: .milliseconds(80), thenClose: false)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        for run in 1...3 {
            try client.send(RequestText.make("GET", origin.url("/parts")))
            let response = try client.readResponse()
            #expect(response.status == 200, "run \(run)")
            #expect(response.body == body, "run \(run)")
            try client.send(RequestText.make("GET", origin.url("/next")))
            #expect(try client.readResponse().bodyText == "after", "run \(run)")
        }
        #expect(proxy.server.metrics().bodySplices == 3)
        #expect(origin.connectionCount == 1)
    }

    /// Requests pipelined behind a body spliced whole at once are answered in order: the exchange ends inside the
    /// flush that started the splice, and the next one is flushed too. The last asks to close, or the client
    /// half-closes after sending them all.
    @Test(arguments: [false, true])
    func requestsPipelinedBehindASplicedBodyAreAnsweredInOrder(halfClose: Bool) throws {
        let origin = try Self.origin()
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        for run in 1...5 {
            let client = try proxy.connect(timeout: .seconds(30))
            defer { client.close() }
            let sizes = [100 << 10, 10, 300 << 10, 100 << 10, 5]
            var batch = ""
            for (index, size) in sizes.enumerated() {
                let last = index == sizes.count - 1 && !halfClose
                batch += RequestText.make("GET", origin.url("/0/\(size)/\(run * 10 + index)"),
                                          headers: last ? [("Connection", "close")] : [])
            }
            try client.send(batch)
            if halfClose { client.shutdownWrite() }
            for (index, size) in sizes.enumerated() {
                var received = StreamChecksum()
                let response = try client.readResponse(bodySink: { received.update($0) })
                #expect(response.status == 200, "run \(run), response \(index)")
                #expect(received.value == PatternBody(length: UInt64(size), seed: UInt64(run * 10 + index)).checksum,
                        "run \(run), response \(index)")
            }
            #expect(client.isClosedByPeer(), "run \(run): the connection closes after the last answer")
        }
    }

    /// Answers with no body or no client to take it, around a body that would be spliced: a `HEAD` whose head names
    /// 200 KiB, a `304`, a body the origin closes after, and clients that reset before the answer (the relay then
    /// fails at once, inside the flush that started it). The proxy answers the next client as ever.
    @Test func bodilessAnswersClosingAnswersAndVanishedClientsAroundASplice() throws {
        let size = 200 << 10
        let pattern = PatternBody(length: UInt64(size), seed: 77)
        let origin = try RecordingOrigin { request in
            switch request.target.split(separator: "/").last ?? "" {
            case "head": return .respond(status: 200, headers: [HTTPField(name: "Content-Length", value: String(size))],
                                         framing: .bodiless)
            case "not-modified": return .status(304)
            case "closing": return .respond(status: 200, headers: [HTTPField(name: "Connection", value: "close")],
                                            body: pattern.bytes)
            default: return .respond(status: 200, body: pattern.bytes)
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        try client.send(RequestText.make("HEAD", origin.url("/head")))
        let head = try client.readResponse(method: "HEAD")
        #expect(head.status == 200 && head.body.isEmpty)
        try client.send(RequestText.make("GET", origin.url("/not-modified")))
        #expect(try client.readResponse().status == 304)
        try client.send(RequestText.make("GET", origin.url("/body")))
        #expect(try client.readResponse().body == pattern.bytes)
        let connectionsBefore = origin.connectionCount
        try client.send(RequestText.make("GET", origin.url("/closing")))
        #expect(try client.readResponse().body == pattern.bytes)
        // `Connection: close` is the origin connection's (hop by hop): the client's carries on, on a new one.
        try client.send(RequestText.make("GET", origin.url("/body")))
        #expect(try client.readResponse().body == pattern.bytes)
        #expect(origin.connectionCount == connectionsBefore + 1)
        for _ in 0..<30 {
            let vanishing = try proxy.connect(timeout: .seconds(30))
            try vanishing.send(RequestText.make("GET", origin.url("/body")))
            vanishing.reset()
        }
        let after = try proxy.connect(timeout: .seconds(30))
        for _ in 0..<3 {
            try after.send(RequestText.make("GET", origin.url("/body")))
            #expect(try after.readResponse().body == pattern.bytes)
        }
    }

    /// A relay stopped with bytes still in its pipe (the client went away mid-body) does not give that pipe back:
    /// the next bodies, through pipes kept in the pool, carry only their own bytes.
    @Test func aPipeLeftWithBytesInItIsNeverUsedAgain() throws {
        let origin = try Self.origin()
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        for round in 1...4 {
            // A client that takes a few bytes of a large body and leaves, while the pipe holds more.
            let leaving = try proxy.connect(timeout: .seconds(30), receiveBuffer: 8 * 1024)
            try leaving.send(RequestText.make("GET", origin.url("/0/\(8 << 20)/\(100 + round)")))
            Thread.sleep(forTimeInterval: 0.2)
            leaving.close()
            let client = try proxy.connect(timeout: .seconds(30))
            defer { client.close() }
            for index in 0..<12 {
                try Self.fetch(client, origin, pad: 0, size: (100 << 10) + index, seed: round * 100 + index,
                               "round \(round), body \(index)")
            }
        }
    }
}
