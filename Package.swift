// swift-tools-version:6.0
// datamode-proxy: an HTTP forward proxy on libevent that enforces data modes (Low Data Mode on the network).
//
// Module map (each module has one job; only DatamodeEngine touches C, besides DatamodeHTTP2's nghttp2 and
// DatamodeDeferral's SQLite):
//   DatamodeHTTP    strict HTTP/1.1 wire parsing and head writing (RFC 9112), pure Swift
//   DatamodeHTTP2   the HTTP/2 codec (RFC 9113, SPEC §17) on nghttp2, no sockets: strict translation to and from
//                   DatamodeHTTP's heads, flow control as backpressure, flood limits; owns the CNghttp2 boundary
//   DatamodePolicy  data modes, request tags, rules, variants, the decision; pure Swift, no I/O
//   DatamodeMedia   HLS master playlists and DASH MPDs capped to a bitrate (SPEC §13); pure Swift, no I/O
//   DatamodeConfig  YAML -> typed, validated configuration sections
//   DatamodeState   what the engine and the admin plane share: runtime snapshot, sessions, budgets, metrics, clock,
//                   when a refusal lifts (SPEC §18.1); pure Swift, no C
//   DatamodeDeferral  the durable store of deferred uploads (SPEC §18.3): SQLite (CSQLite) on its own thread;
//                   no libevent, no Foundation
//   DatamodeEngine  libevent workers, client/upstream connections, tunnels, the admin listener transport
//   DatamodeAdmin   the admin API endpoints (one file per endpoint), state persistence; DatamodeState, not the engine
//   DatamodeInstance  the composition root: one process (state, mode, policy, workers, admin API, reload)
//   DatamodeProxyCommand  the `datamode-proxy` command line
//   DatamodeClient  the client kit for apps (SPEC §14): Foundation only, no dependency on the modules above
import PackageDescription

/// The request path's release builds drop Swift's dynamic exclusivity checks (`swift_beginAccess` and its
/// thread-local access set: 2.5K of the 62K instructions of a plain 1 KiB request, callgrind). The static checks stay,
/// and debug builds, which the tests run, keep the dynamic ones: a violation still stops the suite.
let requestPath: [SwiftSetting] = [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]

let package = Package(
    name: "datamode-proxy",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "datamode-proxy", targets: ["DatamodeProxyCommand"]),
        // The client kit (SPEC §14): Foundation only, for apps on Linux and Apple platforms.
        .library(name: "DatamodeClient", targets: ["DatamodeClient"]),
        .executable(name: "datamode-client-example", targets: ["DatamodeClientExample"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibevent",
            pkgConfig: "libevent",
            providers: [.apt(["libevent-dev"])]
        ),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        // HTTP/2 (SPEC §17): Debian 12's libnghttp2-dev, whose security updates add the options DatamodeHTTP2 sets.
        .systemLibrary(
            name: "CNghttp2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        // SPEC §18.3: the deferred uploads' store (Debian libsqlite3-dev). Only DatamodeDeferral imports it.
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        // SPEC §19: the shared store's client (Debian libhiredis-dev, 0.14 on Debian 12) on its libevent adapter.
        // Only the engine imports it.
        .systemLibrary(
            name: "CHiredis",
            pkgConfig: "hiredis",
            providers: [.apt(["libhiredis-dev"])]
        ),
        .target(
            name: "CDatamodeShims",
            dependencies: ["CLibevent", "COpenSSL"]
        ),
        // SPEC §13 image transcoding: libjpeg-turbo, libpng and libwebp directly (README "Images": chosen over
        // libvips by measurement and by its 162-package dependency tree).
        .target(
            name: "CDatamodeImage",
            cSettings: [.unsafeFlags(["-O2"])],
            linkerSettings: [.linkedLibrary("jpeg"), .linkedLibrary("png16"), .linkedLibrary("webp")]
        ),
        .target(name: "DatamodeHTTP", swiftSettings: requestPath),
        .target(name: "DatamodeHTTP2", dependencies: ["CNghttp2", "DatamodeHTTP"], swiftSettings: requestPath),
        .target(name: "DatamodeClient"),
        // The README's client-kit snippet as a program (`swift run datamode-client-example FULL LOW`).
        .executableTarget(name: "DatamodeClientExample", dependencies: ["DatamodeClient"]),
        .target(name: "DatamodePolicy", swiftSettings: requestPath),
        .target(name: "DatamodeMedia"),
        .target(
            name: "DatamodeConfig",
            dependencies: [
                "DatamodePolicy",
                "DatamodeHTTP",
                .product(name: "Yams", package: "Yams"),
            ]
        ),
        .target(name: "DatamodeState", dependencies: ["DatamodeConfig", "DatamodePolicy"], swiftSettings: requestPath),
        // Not the engine's: the store runs on its own thread and hands results back through completions, so it
        // links neither libevent nor Foundation (SPEC §18: the event loop never waits on the disk).
        .target(name: "DatamodeDeferral", dependencies: ["CSQLite", "DatamodeHTTP"]),
        // Drives a DeferredStore from its own process: the crash test SIGKILLs it (`crash-child`), and
        // bench/deferral-store measures commit latency with it (`bench`).
        .executableTarget(name: "DatamodeDeferralProbe", dependencies: ["DatamodeDeferral", "DatamodeHTTP", "DatamodeTestSupport"]),
        .target(
            name: "DatamodeEngine",
            dependencies: [
                "CLibevent", "COpenSSL", "CDatamodeShims", "CDatamodeImage", "CHiredis",
                "DatamodeHTTP", "DatamodeHTTP2", "DatamodePolicy", "DatamodeConfig", "DatamodeMedia", "DatamodeState",
                "DatamodeDeferral",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: requestPath
        ),
        // Not DatamodeEngine: the admin plane reads the shared state from DatamodeState and links no libevent or
        // OpenSSL; DatamodeInstance wires the engine to it (issue 25).
        .target(
            name: "DatamodeAdmin",
            dependencies: [
                "DatamodeState", "DatamodePolicy", "DatamodeConfig", "DatamodeDeferral",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "DatamodeInstance",
            dependencies: [
                "DatamodeEngine", "DatamodeState", "DatamodeAdmin", "DatamodeConfig", "DatamodePolicy", "DatamodeDeferral",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "DatamodeProxyCommand",
            dependencies: [
                "DatamodeInstance", "DatamodeEngine", "DatamodeAdmin", "DatamodeConfig", "DatamodePolicy",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "DatamodeTestSupport",
            dependencies: [
                "DatamodeInstance", "DatamodeEngine", "DatamodeState", "DatamodeConfig", "DatamodePolicy", "DatamodeHTTP",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        .testTarget(name: "DatamodeClientTests", dependencies: ["DatamodeClient", "DatamodeTestSupport"]),
        .testTarget(name: "DatamodeHTTPTests", dependencies: ["DatamodeHTTP", "DatamodeTestSupport"]),
        // Drives the server session with a real nghttp2 client session in memory, and with hand-built frames.
        .testTarget(name: "DatamodeHTTP2Tests", dependencies: ["DatamodeHTTP2", "DatamodeHTTP", "CNghttp2", "DatamodeTestSupport"]),
        .testTarget(name: "DatamodePolicyTests", dependencies: ["DatamodePolicy", "DatamodeTestSupport"]),
        .testTarget(name: "DatamodeMediaTests", dependencies: ["DatamodeMedia", "DatamodeTestSupport"]),
        .testTarget(name: "DatamodeConfigTests", dependencies: ["DatamodeConfig", "DatamodePolicy"]),
        .testTarget(name: "DatamodeStateTests", dependencies: ["DatamodeState", "DatamodeConfig", "DatamodePolicy"]),
        // The crash test runs the DatamodeDeferralProbe executable, built beside the test bundle.
        .testTarget(name: "DatamodeDeferralTests", dependencies: ["DatamodeDeferral", "DatamodeHTTP", "DatamodeTestSupport"]),
        .testTarget(
            name: "DatamodeEngineTests",
            dependencies: ["DatamodeEngine", "DatamodeState", "DatamodeTestSupport", "DatamodeConfig", "DatamodePolicy", "DatamodeHTTP", "CLibevent"]
        ),
        .testTarget(
            name: "DatamodeAdminTests",
            dependencies: [
                "DatamodeAdmin", "DatamodeState", "DatamodeConfig", "DatamodePolicy",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "DatamodeInstanceTests",
            dependencies: [
                "DatamodeInstance", "DatamodeAdmin", "DatamodeEngine", "DatamodeState", "DatamodeConfig", "DatamodePolicy",
                "DatamodeTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "DatamodeEndToEndTests",
            dependencies: ["DatamodeTestSupport", .product(name: "Yams", package: "Yams")]
        ),
    ]
)

// The libFuzzer target has no `main` of its own (libFuzzer provides it), so it only links in a fuzzer build.
// It is added only when asked for; see README "Fuzzing":
//   DATAMODE_FUZZ=1 swift build -c release --sanitize fuzzer --sanitize address -Xswiftc -sanitize=fuzzer,address \
//       --product DatamodeFuzz --scratch-path .build-fuzz
// (the -Xswiftc form is needed: SwiftPM passes the two sanitizers in random order and the driver keeps the last)
if Context.environment["DATAMODE_FUZZ"] != nil {
    // DatamodeEngine: the in-place paths (FrontParse, BodyRelay) are fuzzed against the DatamodeHTTP references.
    package.targets.append(.executableTarget(name: "DatamodeFuzz", dependencies: ["DatamodeHTTP", "DatamodeHTTP2", "DatamodeEngine", "CLibevent"]))
    package.products.append(.executable(name: "DatamodeFuzz", targets: ["DatamodeFuzz"]))
    package.targets.append(.executableTarget(name: "DatamodeMediaFuzz", dependencies: ["DatamodeMedia"]))
    package.products.append(.executable(name: "DatamodeMediaFuzz", targets: ["DatamodeMediaFuzz"]))
    package.targets.append(.executableTarget(name: "DatamodeImageFuzz", dependencies: ["CDatamodeImage"]))
    package.products.append(.executable(name: "DatamodeImageFuzz", targets: ["DatamodeImageFuzz"]))
    // The HTTP/2 server session after a valid preface: never crashes, surfaces only strictly valid requests.
    package.targets.append(.executableTarget(name: "DatamodeHTTP2Fuzz", dependencies: ["DatamodeHTTP2", "DatamodeHTTP"]))
    package.products.append(.executable(name: "DatamodeHTTP2Fuzz", targets: ["DatamodeHTTP2Fuzz"]))
}
