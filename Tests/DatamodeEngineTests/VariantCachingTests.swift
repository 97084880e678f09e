import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §5: a variant served in place of the requested URL must never be cached as the original. Its response
/// carries `Cache-Control: no-store` and none of the target's validators, and the conditional headers the
/// client sent for the original are not forwarded to the target (whose 304 the client would apply to the
/// original URL's cache entry).
@Suite struct VariantCachingTests {
    static let constrained = DataMode(constrained: true, expensive: false)

    /// What a browser sends when it revalidates its cached copy of the original image.
    static let conditionals: [(String, String)] = [
        ("If-None-Match", "\"full-size-v1\""),
        ("If-Modified-Since", "Tue, 01 Apr 2025 10:00:00 GMT"),
        ("If-Match", "\"full-size-v1\""),
        ("If-Unmodified-Since", "Tue, 01 Apr 2025 10:00:00 GMT"),
        ("If-Range", "\"full-size-v1\""),
    ]

    /// A CDN that answers like a real one: long-lived caching and both validators.
    static func cdn() throws -> RecordingOrigin {
        try RecordingOrigin { request in
            .ok("small \(request.target)", headers: [
                ("Content-Type", "image/jpeg"),
                ("Cache-Control", "public, max-age=31536000, immutable"),
                ("ETag", "\"small-v1\""),
                ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ])
        }
    }

    static func expectServedInPlace(_ response: ParsedResponse, variant: String,
                                    sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(response.status == 200, "\(response.headText)", sourceLocation: sourceLocation)
        #expect(response.values(of: "Cache-Control") == ["no-store"], "\(response.headText)", sourceLocation: sourceLocation)
        #expect(!response.contains("ETag"), "\(response.headText)", sourceLocation: sourceLocation)
        #expect(!response.contains("Last-Modified"), "\(response.headText)", sourceLocation: sourceLocation)
        #expect(response.value(of: "Data-Mode-Variant") == variant, sourceLocation: sourceLocation)
    }

    static func expectNoConditionals(_ request: RecordedRequest, sourceLocation: SourceLocation = #_sourceLocation) {
        for (name, _) in conditionals {
            #expect(!request.contains(name), "\(name) forwarded to the variant target: \(request.headText)",
                    sourceLocation: sourceLocation)
        }
    }

    @Test func aTargetVariantIsNoStoreWithoutValidatorsAndItsRequestIsNotConditional() throws {
        let original = try RecordingOrigin { _ in .ok("full") }
        defer { original.stop() }
        let cdn = try Self.cdn()
        defer { cdn.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: hero-small
                match: "\(original.url("/img/*.jpg"))"
                target: "\(cdn.url("/img/$1@small.jpg"))"
                when: constrained
            """, mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", original.url("/img/hero.jpg"), headers: Self.conditionals))
        let response = try client.readResponse()
        Self.expectServedInPlace(response, variant: "hero-small")
        #expect(response.bodyText == "small /img/hero@small.jpg")
        let fetched = try #require(cdn.requests.first)
        Self.expectNoConditionals(fetched)
        #expect(original.requests.isEmpty)
    }

    @Test func anAlwaysVariantIsAlsoServedInPlaceOfTheOriginal() throws {
        let cdn = try Self.cdn()
        defer { cdn.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: api-v2
                match: "\(cdn.url("/api/v1/*"))"
                target: "\(cdn.url("/api/v2/$1"))"
                when: always
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", cdn.url("/api/v1/users"), headers: Self.conditionals))
        Self.expectServedInPlace(try client.readResponse(), variant: "api-v2")
        Self.expectNoConditionals(try #require(cdn.requests.first))
    }

    @Test func aFileVariantIsNoStore() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-variant-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory.appendingPathComponent("variants"), withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data("poster".utf8).write(to: directory.appendingPathComponent("variants/poster.jpg"))
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: poster
                match: "\(origin.url("/promo.mp4"))"
                file: variants/poster.jpg
                when: constrained
            """, mode: Self.constrained, baseDirectory: directory.path)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/promo.mp4"), headers: Self.conditionals))
        let response = try client.readResponse()
        Self.expectServedInPlace(response, variant: "poster")
        #expect(response.bodyText == "poster")
        try client.send(RequestText.make("HEAD", origin.url("/promo.mp4")))
        Self.expectServedInPlace(try client.readResponse(method: "HEAD"), variant: "poster")
        #expect(origin.requests.isEmpty)
    }

    /// `If-Range` asks for the rest of the client's partial copy of the original: without it, a `Range` would
    /// splice the variant's bytes onto the original's. So both go, and the client gets the whole variant.
    /// A plain `Range` (a player seeking in the variant itself) is still forwarded.
    @Test func aRangeConditionalOnTheOriginalIsDroppedAPlainRangeIsKept() throws {
        let original = try RecordingOrigin { _ in .ok("full") }
        defer { original.stop() }
        let cdn = try Self.cdn()
        defer { cdn.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: low-res
                match: "\(original.url("/video/*.mp4"))"
                target: "\(cdn.url("/video/$1-240p.mp4"))"
                when: constrained
            """, mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", original.url("/video/intro.mp4"),
                                         headers: [("Range", "bytes=1000-"), ("If-Range", "\"full-size-v1\"")]))
        Self.expectServedInPlace(try client.readResponse(), variant: "low-res")
        try client.send(RequestText.make("GET", original.url("/video/intro.mp4"), headers: [("Range", "bytes=0-99")]))
        Self.expectServedInPlace(try client.readResponse(), variant: "low-res")

        let requests = cdn.requests
        try #require(requests.count == 2)
        #expect(!requests[0].contains("Range") && !requests[0].contains("If-Range"), "\(requests[0].headText)")
        #expect(requests[1].values(of: "Range") == ["bytes=0-99"], "\(requests[1].headText)")
    }

    /// The rules are for variants only: an ordinary response keeps its caching headers, and an ordinary
    /// revalidation reaches the origin.
    @Test func aForwardedRequestKeepsItsConditionalsAndItsResponseItsValidators() throws {
        let cdn = try Self.cdn()
        defer { cdn.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", cdn.url("/img/hero.jpg"), headers: Self.conditionals))
        let response = try client.readResponse()
        #expect(response.values(of: "Cache-Control") == ["public, max-age=31536000, immutable"])
        #expect(response.value(of: "ETag") == "\"small-v1\"")
        #expect(response.value(of: "Last-Modified") == "Mon, 01 Jan 2024 00:00:00 GMT")
        #expect(!response.contains("Data-Mode-Variant"))
        let forwarded = try #require(cdn.requests.first)
        for (name, value) in Self.conditionals {
            #expect(forwarded.values(of: name) == [value], "\(name)")
        }
    }
}
