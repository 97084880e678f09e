import DatamodeHTTP
@testable import DatamodeEngine
import Testing

/// SPEC §16: HTTP/3 alternatives are removed from `Alt-Svc` on the transparent listener, nothing else.
@Suite("Alt-Svc without HTTP/3")
struct AltSvcTests {
    @Test("values", arguments: [
        ("h3=\":443\"; ma=86400", nil),
        ("h3=\":443\"; ma=86400, h3-29=\":443\"; ma=86400", nil),
        ("h3-29=\":443\", h2=\"alt.example:443\"; ma=60", "h2=\"alt.example:443\"; ma=60"),
        ("h2=\"a,b:443\", h3=\":443\"", "h2=\"a,b:443\""),
        ("clear", "clear"),
        ("h3x=\":443\"", "h3x=\":443\""),
        (" , h3=\":443\" ,, quic=\":443\" ", "quic=\":443\""),
        ("h2=\"x\\\"y,z:1\", h3=\":1\"", "h2=\"x\\\"y,z:1\""),
    ] as [(String, String?)])
    func values(_ value: String, _ expected: String?) {
        #expect(AltSvc.withoutHTTP3(value) == expected)
    }

    @Test("a head: emptied fields go, others stay in order")
    func head() {
        let head = ResponseHead(version: .http11, status: 200, reason: "OK", fields: [
            HTTPField(name: "Alt-Svc", value: "h3=\":443\""), HTTPField(name: "Content-Length", value: "0"),
            HTTPField(name: "alt-svc", value: "h2=\":8443\", h3-29=\":443\""),
        ])
        let stripped = AltSvc.withoutHTTP3(head)
        #expect(stripped.fields == [HTTPField(name: "Content-Length", value: "0"), HTTPField(name: "alt-svc", value: "h2=\":8443\"")])
    }
}
