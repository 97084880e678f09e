@testable import DatamodeEngine
import Testing

/// The head writers' field classifier (no allocation, no hashing) must agree with plain case-insensitive names.
@Suite struct KnownFieldTests {
    static let names: [(String, KnownField)] = [
        ("Connection", .connection), ("proxy-connection", .proxyConnection), ("Keep-Alive", .keepAlive), ("TE", .te),
        ("Trailer", .trailer), ("UPGRADE", .upgrade), ("Proxy-Authorization", .proxyAuthorization),
        ("Proxy-Authenticate", .proxyAuthenticate), ("host", .host), ("Allow-Constrained", .allowConstrained),
        ("allow-expensive", .allowExpensive), ("Allow-Ultra-Constrained", .allowUltraConstrained),
        ("Save-Data", .saveData), ("Data-Mode-Variant", .dataModeVariant), ("content-length", .contentLength),
        ("Transfer-Encoding", .transferEncoding), ("If-None-Match", .ifNoneMatch),
        ("if-modified-since", .ifModifiedSince), ("If-Match", .ifMatch), ("If-Unmodified-Since", .ifUnmodifiedSince),
        ("If-Range", .ifRange), ("Range", .range), ("Cache-Control", .cacheControl), ("ETag", .etag),
        ("Last-Modified", .lastModified), ("Expires", .expires),
        // Same lengths, other names: never mistaken.
        ("tx", .other), ("Hose", .other), ("ranges", .other), ("Upgrader", .other), ("Contents-Length", .other),
        ("Transfer-Encodinf", .other), ("X-Forwarded-For", .other), ("", .other), ("Content-Type", .other),
        ("Host ", .other),
    ]

    @Test(arguments: names)
    func classifies(name: String, expected: KnownField) {
        #expect(KnownField.of(name) == expected)
    }
}
