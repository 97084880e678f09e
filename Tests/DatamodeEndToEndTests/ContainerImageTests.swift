// The image itself, built and run with podman: `docker/test-image.sh` from the test suite, as an opt-in.
// It needs root on Debian 12 and costs minutes the first time (it installs podman and makes the base images;
// later runs reuse them and take seconds), so `scripts/test.sh` runs it only with DATAMODE_CONTAINER_TESTS=1:
//   DATAMODE_CONTAINER_TESTS=1 swift test --filter ContainerImageTests
// docker/README.md ("Testing the image with podman") says what each check does.
import DatamodeTestSupport
import Foundation
import Testing

private let optIn = ProcessInfo.processInfo.environment["DATAMODE_CONTAINER_TESTS"] ?? ""

/// One line of the script's output per check; each must say PASS.
private let expectedChecks = [
    "the container starts: GET /healthz is 200",
    "HEALTHCHECK",
    "PID 1 is datamode-proxy, uid 10001, no capabilities",
    "GET /mode without the token: 401",
    "through the proxy: 200, the origin saw Via: 1.1 datamode-proxy",
    "PUT /mode {\"mode\": \"constrained\"}: 200",
    "after PUT /mode: GET http://cdn.example/promo.mp4 is the variant file mounted from the host",
    "403, Network-Unavailable-Reason: constrained",
    "the API mode survives: a new container on the same volume is constrained",
    "in the new container: GET http://cdn.example/promo.mp4 is the variant file mounted from the host",
    "SIGTERM with a request in flight: the request completes",
    "DATAMODE_MODE=bogus: exit 78",
    "podman-compose config accepts docker/compose.yaml",
    "the app got the variant",
    "the app got a constrained rejection",
    "the app's page request reached the loopback origin through the proxy",
    "podman-compose down -v: no container and no volume of the project is left",
    // docker/transparent/compose.yaml (SPEC §16): an app with no proxy variable gets a variant and refusals.
    "the init container (NET_ADMIN, in the proxy's network namespace) applied the rules and exited 0",
    "the app's environment has no proxy variable",
    "the app with no proxy setting got the variant (video 200 variant=promo-poster); access log: \"variant\":\"promo-poster\",\"source\":\"transparent\"",
    "the app with no proxy setting got a constrained refusal (clip 403 reason=constrained); access log: \"outcome\":\"rejected\", \"source\":\"transparent\"",
    "the app's HTTPS request was refused inside TLS (tls 403 reason=constrained",
    "podman-compose down -v (transparent): no container and no volume of the project is left",
    "the host's own network namespace is as at the start",
]

@Suite("docker/test-image.sh: the image built and run with podman (opt-in)")
struct ContainerImageTests {
    @Test("DATAMODE_CONTAINER_TESTS is unset, 0 or 1")
    func optInValue() {
        #expect(["", "0", "1"].contains(optIn),
                "DATAMODE_CONTAINER_TESTS='\(optIn)': set it to 1 to build and run the image with podman, or leave it unset")
    }

    @Test(
        "the image builds from docker/Dockerfile and passes every container and compose check",
        .enabled(if: optIn == "1", "set DATAMODE_CONTAINER_TESTS=1 to build and run the image with podman (root, Debian 12; docker/README.md)"),
        .timeLimit(.minutes(60))
    )
    func imageChecks() throws {
        // A cold run (packages, base images, a release build in the image) takes minutes on a loaded machine.
        let result = try ExternalCommand.run("/bin/bash", [ProxyProcess.packageRoot + "/docker/test-image.sh"], timeout: 3000)
        #expect(result.status == 0, "docker/test-image.sh exited \(result.status):\n\(result.output)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        let failed = lines.filter { $0.hasPrefix("FAIL ") }
        #expect(failed.isEmpty, "\(failed.joined(separator: "\n"))")
        for check in expectedChecks {
            #expect(lines.contains { $0.hasPrefix("PASS ") && $0.contains(check) }, "no PASS line for: \(check)\n\(result.stdout)")
        }
        #expect(lines.contains { $0.hasPrefix("\(expectedChecks.count) checks passed, 0 failed, in ") },
                "\(lines.suffix(3).joined(separator: "\n"))")
    }
}
