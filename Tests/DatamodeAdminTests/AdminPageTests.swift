import DatamodeAdmin
import Testing

/// `GET /` (SPEC §20): the admin page, self-contained and reading only this listener.
@Suite("Admin: the page")
struct AdminPageTests {
    @Test func thePageIsOneSelfContainedDocument() throws {
        let response = try AdminFixture().handle("GET", "/")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "text/html; charset=utf-8")
        let csp = try #require(response.header("Content-Security-Policy"))
        #expect(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"))
        let html = response.text
        #expect(html.hasPrefix("<!doctype html>") && html.hasSuffix("</html>"))
        // Nothing is fetched from elsewhere: no absolute URL but the SVG namespace, no external script or sheet.
        let urls = html.components(separatedBy: "http").dropFirst().map { "http" + $0.prefix(40) }
        #expect(urls.allSatisfy { $0.hasPrefix("http://www.w3.org/2000/svg") }, "\(urls)")
        #expect(!html.contains("<script src") && !html.contains("<link"))
        // It reads the endpoints SPEC §20 names.
        for path in ["/events", "/mode", "/conditions", "/budgets", "/refusals", "/stats/timeline", "/sessions",
                     "/schedule", "/deferred"] {
            #expect(html.contains("\"\(path)\""), "\(path)")
        }
    }

    @Test func headAnswersWithoutTheDocumentAndOtherMethodsAre405() throws {
        let fixture = try AdminFixture()
        #expect(fixture.handle("HEAD", "/").status == 200)
        #expect(fixture.handle("PUT", "/").status == 405)
    }
}
