import DatamodeState

/// `GET /ca.pem` (SPEC §9): the local CA's certificate, for a client to trust. A certificate is public; its key is
/// never served. On a loopback admin listener it needs no token (whoever can reach it runs on this machine, and a
/// browser fetching it has no way to send one); elsewhere `admin.token` (or `admin.read-token`) is required like
/// anywhere else.
struct CACertificateEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        guard let pem = api.caCertificate() else {
            return AdminProblem.response(404, "not-found", "no CA is loaded: set tls.intercept (a CA is then created at start-up) "
                + "or run `datamode-proxy ca init`, then restart")
        }
        return AdminResponse(status: 200, headers: [
            ("Content-Type", "application/x-pem-file"),
            ("Content-Disposition", "attachment; filename=\"datamode-proxy-ca.pem\""),
            ("Cache-Control", "no-store"),
        ], body: Array(pem.utf8))
    }
}
