import CNghttp2
import DatamodeHTTP
import DatamodeHTTP2
import Testing

/// The header blocks the proxy sends are held to what it sends in one and to what the client said it takes
/// (RFC 9113 §6.5.2): a head or trailers past either are refused before they are submitted, so that the engine can
/// answer otherwise. nghttp2 used to take them and drop the HEADERS when it came to send them, leaving the stream
/// open with nothing said.
@Suite("HTTP/2 header block limits")
struct HeaderBlockLimitTests {
    /// About `bytes` of fields, 500 a field.
    static func fields(_ bytes: Int) -> [HTTPField] {
        (0..<bytes / 500).map { HTTPField(name: "x-filler-\($0)", value: String(repeating: "v", count: 480)) }
    }

    static func isTooLarge(_ error: HTTP2SessionError?) -> Bool {
        if case .headerListTooLarge? = error { true } else { false }
    }

    @Test("A head over what the proxy sends in one header block is refused; the stream is answered otherwise")
    func overTheSendLimit() throws {
        let link = try Link()
        let id = link.client.request()
        try link.pump()
        // limits.header-section (64 KiB by default) plus 16 KiB; the client (nghttp2) announced no limit.
        #expect(link.server.headerListLimit == 80 * 1024)
        #expect(link.server.headerListProblem(pseudo: [(":status", "200")], fields: Self.fields(70_000)) == nil)
        let error = #expect(throws: HTTP2SessionError.self) {
            try link.server.sendResponseHead(id, status: 200, fields: Self.fields(100_000), endStream: true)
        }
        #expect(Self.isTooLarge(error), "\(String(describing: error))")
        try link.server.sendResponseHead(id, status: 502, fields: [], endStream: true)
        try link.pump()
        #expect(link.client.responses[id]?.statuses == [502])
        #expect(link.client.responses[id]?.closed == 0)
    }

    @Test("A head, a 1xx or trailers over the client's SETTINGS_MAX_HEADER_LIST_SIZE are refused; within it they go out")
    func overWhatTheClientTakes() throws {
        let link = try Link()
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                               value: 20_000)]
        nghttp2_submit_settings(link.client.session, 0, &settings, 1)
        let id = link.client.request()
        try link.pump()
        #expect(link.server.headerListLimit == 20_000)
        let hint = #expect(throws: HTTP2SessionError.self) {
            try link.server.sendInformational(id, status: 103, fields: Self.fields(25_000))
        }
        #expect(Self.isTooLarge(hint), "\(String(describing: hint))")
        let head = #expect(throws: HTTP2SessionError.self) {
            try link.server.sendResponseHead(id, status: 200, fields: Self.fields(25_000), endStream: false)
        }
        #expect(Self.isTooLarge(head), "\(String(describing: head))")
        try link.server.sendResponseHead(id, status: 200, fields: Self.fields(15_000), endStream: false)
        try Array("body".utf8).withUnsafeBytes { _ = try link.server.sendResponseBody(id, $0) }
        let trailers = #expect(throws: HTTP2SessionError.self) {
            try link.server.finishResponse(id, trailers: Self.fields(25_000))
        }
        #expect(Self.isTooLarge(trailers), "\(String(describing: trailers))")
        try link.server.finishResponse(id, trailers: [HTTPField(name: "x-checksum", value: "c0ffee")])
        try link.pump()
        let response = try #require(link.client.responses[id])
        #expect(response.statuses == [200] && response.body == Array("body".utf8) && response.closed == 0)
        #expect(response.trailers.map { "\($0.0): \($0.1)" } == ["x-checksum: c0ffee"])
    }
}
