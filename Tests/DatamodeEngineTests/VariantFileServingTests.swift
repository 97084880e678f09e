import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §5: a file variant is opened so that nothing can block a worker. A file declared as a regular file and
/// later swapped for a FIFO or a symbolic link gets a prompt problem+json error, and the proxy keeps serving.
@Suite struct VariantFileServingTests {
    /// A config directory with `variants/poster.jpg` and, outside the variants directory, `secret.txt`.
    final class Fixture {
        let directory: String
        var poster: String { directory + "/variants/poster.jpg" }
        var secret: String { directory + "/secret.txt" }

        init() throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-variant-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
            try Data("poster bytes".utf8).write(to: URL(fileURLWithPath: directory + "/variants/poster.jpg"))
            try Data("root:x:0:0:secret".utf8).write(to: URL(fileURLWithPath: directory + "/secret.txt"))
        }

        /// Replaces the poster with a FIFO (mkfifo), as someone with write access to the directory could.
        func swapPosterForFIFO() throws {
            try FileManager.default.removeItem(atPath: poster)
            guard mkfifo(poster, 0o600) == 0 else { throw CocoaError(.fileWriteUnknown) }
        }

        /// Opens the FIFO for writing, which releases any reader blocked in `open()` (so that a proxy that did
        /// block can still be stopped when the test fails).
        func releaseFIFOReaders() {
            let fd = open(poster, O_WRONLY | O_NONBLOCK)
            if fd >= 0 { close(fd) }
        }

        deinit { try? FileManager.default.removeItem(atPath: directory) }
    }

    static func yaml(_ origin: RecordingOrigin) -> String {
        """
        threads: 1
        variants:
          - id: poster
            match: "\(origin.url("/promo.mp4"))"
            file: variants/poster.jpg
            when: always
        """
    }

    @Test func aFileSwappedForAFIFOAnswersAnErrorPromptlyAndTheWorkerKeepsServing() throws {
        let fixture = try Fixture()
        let origin = try RecordingOrigin { request in .ok("origin \(request.target)") }
        defer { origin.stop() }
        // One worker: a worker blocked in open() would stall every connection.
        let proxy = try ProxyHarness(yaml: Self.yaml(origin), baseDirectory: fixture.directory, threads: 1)
        defer {
            fixture.releaseFIFOReaders()
            proxy.stop()
        }
        let client = try proxy.connect(timeout: .seconds(3))

        try client.send(RequestText.make("GET", origin.url("/promo.mp4")))
        let served = try client.readResponse()
        #expect(served.status == 200)
        #expect(served.bodyText == "poster bytes")

        try fixture.swapPosterForFIFO()
        let start = ContinuousClock.now
        try client.send(RequestText.make("GET", origin.url("/promo.mp4")))
        let refused = try client.readResponse()
        #expect(ContinuousClock.now - start < .seconds(2))
        expectProblem(refused, status: 502, error: "upstream-unreachable")
        #expect(refused.value(of: "Data-Mode-Variant") == nil || refused.value(of: "Data-Mode-Variant") == "poster")

        // The same connection and a new one are both still served.
        try client.send(RequestText.make("GET", origin.url("/page")))
        #expect(try client.readResponse().bodyText == "origin /page")
        let other = try proxy.connect(timeout: .seconds(3))
        try other.send(RequestText.make("GET", origin.url("/other")))
        #expect(try other.readResponse().bodyText == "origin /other")
    }

    @Test func aFileSwappedForASymlinkIsNotFollowed() throws {
        let fixture = try Fixture()
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(origin), baseDirectory: fixture.directory, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(3))

        try FileManager.default.removeItem(atPath: fixture.poster)
        try FileManager.default.createSymbolicLink(atPath: fixture.poster, withDestinationPath: fixture.secret)
        try client.send(RequestText.make("GET", origin.url("/promo.mp4")))
        let refused = try client.readResponse()
        expectProblem(refused, status: 502, error: "upstream-unreachable")
        #expect(!refused.bodyText.contains("secret"))
    }

    @Test func aFileSwappedForADirectoryIsAnError() throws {
        let fixture = try Fixture()
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(origin), baseDirectory: fixture.directory, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(3))

        try FileManager.default.removeItem(atPath: fixture.poster)
        try FileManager.default.createDirectory(atPath: fixture.poster, withIntermediateDirectories: false)
        try client.send(RequestText.make("GET", origin.url("/promo.mp4")))
        expectProblem(try client.readResponse(), status: 502, error: "upstream-unreachable")
        try client.send(RequestText.make("GET", origin.url("/after")))
        #expect(try client.readResponse().status == 200)
    }
}

/// Found from outside: `O_NOFOLLOW` guards only the last component. A directory on the way to a declared file,
/// swapped for a symbolic link to elsewhere, served the file of the same name outside the variants directory.
@Suite struct VariantMiddleSymlinkTests {
    @Test func aDirectorySwappedForASymlinkOutsideIsNotFollowed() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-middle-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        try FileManager.default.createDirectory(atPath: base + "/variants/sub", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: base + "/outside", withIntermediateDirectories: true)
        try Data("inside".utf8).write(to: URL(fileURLWithPath: base + "/variants/sub/f.jpg"))
        try Data("SECRET".utf8).write(to: URL(fileURLWithPath: base + "/outside/f.jpg"))
        let origin = try RecordingOrigin { _ in .ok("origin") }
        defer { origin.stop() }
        let yaml = """
            variants:
              - id: sub
                match: "\(origin.url("/s.jpg"))"
                file: variants/sub/f.jpg
                when: always
            """
        let proxy = try ProxyHarness(yaml: yaml, baseDirectory: base, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(3))
        try client.send(RequestText.make("GET", origin.url("/s.jpg")))
        #expect(try client.readResponse().bodyText == "inside")

        try FileManager.default.removeItem(atPath: base + "/variants/sub")
        try FileManager.default.createSymbolicLink(atPath: base + "/variants/sub", withDestinationPath: base + "/outside")
        try client.send(RequestText.make("GET", origin.url("/s.jpg")))
        let response = try client.readResponse()
        #expect(response.status == 502)
        #expect(!response.bodyText.contains("SECRET"))
    }
}
