import DatamodeAdmin
import Testing

/// `GET /ca.pem` (SPEC §9): the CA certificate for clients to trust; open on a loopback admin listener, token-bound
/// elsewhere; never the key.
@Suite("Admin: /ca.pem")
struct CACertificateEndpointTests {
    static let pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"

    @Test("loopback listener: served without a token, even when a token is set", arguments: [nil, "t0ken"] as [String?])
    func loopbackNeedsNoToken(_ token: String?) throws {
        let response = try AdminFixture(token: token, caCertificate: Self.pem).handle("GET", "/ca.pem")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "application/x-pem-file")
        #expect(response.text == Self.pem)
    }

    @Test func aNonLoopbackListenerRequiresTheToken() throws {
        let fixture = try AdminFixture("admin: {listen: 0.0.0.0:8878, token: t0ken}", token: "t0ken", caCertificate: Self.pem)
        expectProblem(fixture.handle("GET", "/ca.pem"), 401, "unauthorized")
        let authorized = fixture.handle("GET", "/ca.pem", headers: ["authorization": "Bearer t0ken"])
        #expect(authorized.status == 200)
        #expect(authorized.text == Self.pem)
    }

    /// SPEC §9: off loopback, `admin.read-token` fetches the certificate as `admin.token` does (a path monitor's
    /// credentials are enough to set a client up), and grants nothing that changes state.
    @Test func aNonLoopbackListenerAcceptsTheReadTokenToo() throws {
        let fixture = try AdminFixture("admin: {listen: 0.0.0.0:8878, token: t0ken}", token: "t0ken", readToken: "l00k",
                                       caCertificate: Self.pem)
        let response = fixture.handle("GET", "/ca.pem", headers: ["authorization": "Bearer l00k"])
        #expect(response.status == 200)
        #expect(response.text == Self.pem)
        expectProblem(fixture.handle("PUT", "/mode", headers: ["authorization": "Bearer l00k"]), 401, "unauthorized")
        expectProblem(fixture.handle("GET", "/ca.pem", headers: ["authorization": "Bearer wrong"]), 401, "unauthorized")
    }

    @Test func withoutACAItIs404SayingHowToMakeOne() throws {
        let response = try AdminFixture().handle("GET", "/ca.pem")
        expectProblem(response, 404, "not-found")
        #expect(response.text.contains("ca init"))
    }

    @Test(arguments: ["PUT", "POST", "DELETE"])
    func onlyGetAndHead(_ method: String) throws {
        let response = try AdminFixture(caCertificate: Self.pem).handle(method, "/ca.pem")
        expectProblem(response, 405, "method-not-allowed")
        #expect(response.header("Allow") == "GET, HEAD")
    }
}
