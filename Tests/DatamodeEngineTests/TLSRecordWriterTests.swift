import DatamodeTestSupport
import Foundation
import Testing

/// An HTTP/1.1 TLS origin's records are written at the end of the callback that made them (`TLSRecordWriter`), and
/// libevent's write path takes over only while plaintext waits in the filter (an upload larger than its socket's
/// watermark, an origin that reads slowly). This walks one origin connection through both and back, again and again:
/// a request whose records were left unwritten would hang the next answer, and every byte is checked.
@Suite(.serialized) struct TLSRecordWriterTests {
    @Test(arguments: ["--http1.1", "--http2"])
    func smallRequestsUploadsAndSlowReadsShareOneOriginConnection(http: String) throws {
        let directory = try ScratchDirectory.make("datamode-tls-records")
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin")
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            connect: {ports: [\(origin.port)]}
            tls: {intercept: [localhost], upstream-verify: false}
            http2: {upstream: false}
            """)
        defer { proxy.stop() }
        let size = 3 * 1024 * 1024
        var body = [UInt8](repeating: 0, count: size)
        for i in body.indices { body[i] = UInt8(truncatingIfNeeded: i &* 13 &+ i >> 10) }
        try Data(body).write(to: URL(fileURLWithPath: directory + "/up.bin"))
        let digest = String(try ExternalCommand.run("/usr/bin/sha256sum", [directory + "/up.bin"], timeout: 30).stdout.prefix(64))
        let base = "https://localhost:\(origin.port)"
        var argv = ["-sS"]
        var expected: [(file: String, answer: String?, bytes: Int?)] = []
        for round in 0..<3 {
            let steps: [([String], String?, Int?)] = [
                (["\(base)/bytes/\(1_000 + round)"], nil, 1_000 + round),
                (["--data-binary", "@" + directory + "/up.bin", "\(base)/slow-read"], "received \(size) bytes sha256 \(digest)", nil),
                (["\(base)/bytes/\(300_000 + round)"], nil, 300_000 + round),
                (["--data-binary", "@" + directory + "/up.bin", "\(base)/upload"], "received \(size) bytes sha256 \(digest)", nil),
                (["--data-binary", "small", "\(base)/upload"], "received 5 bytes", nil),
            ]
            for (args, answer, bytes) in steps {
                if !expected.isEmpty { argv.append("--next") }
                let file = directory + "/out-\(expected.count)"
                argv += ["-x", "http://127.0.0.1:\(proxy.port)", "--cacert", proxy.stateDirectory + "/ca.pem", http,
                         "-o", file, "-w", "%{http_code}\n"] + args
                expected.append((file, answer, bytes))
            }
        }
        let result = try ExternalCommand.run("/usr/bin/curl", argv, timeout: 120)
        #expect(result.stdout == String(repeating: "200\n", count: expected.count), "\(result.output.suffix(600))")
        for (index, want) in expected.enumerated() {
            let got = (try? Data(contentsOf: URL(fileURLWithPath: want.file))) ?? Data()
            if let answer = want.answer {
                #expect(String(decoding: got, as: UTF8.self).hasPrefix(answer), "step \(index)")
            } else if let bytes = want.bytes {
                #expect(got.count == bytes, "step \(index)")
                #expect(got.enumerated().allSatisfy { $0.element == HTTPSOrigin.patternByte($0.offset) }, "step \(index)")
            }
        }
    }
}
