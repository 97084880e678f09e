import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SPEC §5: a variant's `file` must resolve (after `..` and symbolic links) to a regular file inside the variants
/// directory (`variants-dir`, default `variants/` beside the config file); anything else is refused when the variant
/// is declared, naming the key and line.
@Suite("Variant files stay inside variants-dir")
struct VariantFileTests {
    /// A config directory with:
    /// - `variants/poster.jpg`, `variants/sub/` (a directory), `variants/pipe` (a FIFO),
    /// - `variants/alias.jpg` -> `poster.jpg` (a link that stays inside),
    /// - `variants/escape.jpg` -> `../outside.jpg` (a link that leads out),
    /// - `outside.jpg` next to the config, and `assets/logo.png` for another `variants-dir`.
    static func fixture() throws -> String {
        let directory = try makeTemporaryDirectory()
        let manager = FileManager.default
        try manager.createDirectory(atPath: directory + "/variants/sub", withIntermediateDirectories: true)
        try manager.createDirectory(atPath: directory + "/assets", withIntermediateDirectories: true)
        _ = manager.createFile(atPath: directory + "/variants/poster.jpg", contents: Data([1, 2, 3]))
        _ = manager.createFile(atPath: directory + "/outside.jpg", contents: Data([4, 5, 6]))
        _ = manager.createFile(atPath: directory + "/assets/logo.png", contents: Data([7]))
        try manager.createSymbolicLink(atPath: directory + "/variants/alias.jpg", withDestinationPath: "poster.jpg")
        try manager.createSymbolicLink(atPath: directory + "/variants/escape.jpg", withDestinationPath: "../outside.jpg")
        guard mkfifo(directory + "/variants/pipe", 0o600) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: "mkfifo failed: \(errno)"])
        }
        return directory
    }

    static func fileVariant(_ file: String) -> String {
        "variants:\n  - id: v\n    match: http://o.example/trav\n    file: \"\(file)\"\n    when: always"
    }

    static let refused: [ErrorCase] = [
        ErrorCase(fileVariant("../../../../etc/passwd"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("/etc/passwd"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("outside.jpg"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("variants/../outside.jpg"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("variants/escape.jpg"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("/dev/zero"), key: "variants[0].file", line: 4, "outside the variants directory"),
        ErrorCase(fileVariant("variants/pipe"), key: "variants[0].file", line: 4, "is not a regular file (it is a FIFO)"),
        ErrorCase(fileVariant("variants/sub"), key: "variants[0].file", line: 4, "is not a regular file (it is a directory)"),
        ErrorCase(fileVariant("variants"), key: "variants[0].file", line: 4, "is not a regular file (it is a directory)"),
        ErrorCase(fileVariant("variants/missing.jpg"), key: "variants[0].file", line: 4, "does not exist"),
        // Found from outside: names no file has were accepted, cut at the NUL or normalised.
        ErrorCase(fileVariant("variants/poster.jpg\\u0000x"), key: "variants[0].file", line: 4, "contains a NUL byte"),
        ErrorCase(fileVariant("variants/poster.jpg/"), key: "variants[0].file", line: 4, "ends with / (a directory)"),
        // With another variants-dir, the default one is no longer allowed.
        ErrorCase("variants-dir: assets\n" + fileVariant("variants/poster.jpg"), key: "variants[0].file", line: 5,
                  "outside the variants directory"),
    ]

    @Test("a file outside the variants directory, or not a regular file, is refused at load", arguments: refused)
    func refusedFile(_ errorCase: ErrorCase) throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        expectError(errorCase, base: directory)
    }

    @Test("the refusal names the resolved path and the variants directory")
    func refusalMessage() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let error = parseError(Self.fileVariant("variants/escape.jpg"), base: directory)
        #expect(error?.message == #"variant "v": file "variants/escape.jpg" resolves to "\#(directory)/outside.jpg", "#
            + #"outside the variants directory "\#(directory)/variants" (variants-dir)"#)
    }

    @Test("files inside the variants directory are accepted as their real path", arguments: [
        ("variants/poster.jpg", "/variants/poster.jpg"),
        ("./variants/sub/../poster.jpg", "/variants/poster.jpg"),
        ("variants/alias.jpg", "/variants/poster.jpg"),
    ])
    func acceptedFile(_ written: String, _ resolved: String) throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = try parse(Self.fileVariant(written), base: directory)
        #expect(configuration.variants.first?.resource == .file(path: directory + resolved, contentType: nil))
    }

    @Test("an absolute path inside the variants directory is accepted")
    func absoluteInside() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = try parse(Self.fileVariant(directory + "/variants/poster.jpg"), base: directory)
        #expect(configuration.variants.first?.resource == .file(path: directory + "/variants/poster.jpg", contentType: nil))
    }

    @Test("variants-dir is relative to the config file's directory", arguments: ["assets", "./assets/", "ASSETS_ABSOLUTE"])
    func otherVariantsDirectory(_ written: String) throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let setting = written == "ASSETS_ABSOLUTE" ? directory + "/assets" : written
        let configuration = try parse("variants-dir: \"\(setting)\"\n" + Self.fileVariant("assets/logo.png"), base: directory)
        #expect(configuration.variantsDirectory == directory + "/assets")
        #expect(configuration.variants.first?.resource == .file(path: directory + "/assets/logo.png", contentType: nil))
        #expect(configuration.variantFiles.directory == directory + "/assets")
    }

    @Test("the default variants directory is variants/ beside the config file")
    func defaultDirectory() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = try parse("variants-dir: null\n", base: directory)
        #expect(configuration.variantsDirectory == nil)
        #expect(configuration.variantFiles.baseDirectory == directory)
        #expect(configuration.variantFiles.directory == directory + "/variants")
    }

    @Test("without a config file, relative files and the variants directory are taken from the working directory")
    func withoutConfigFile() {
        let cwd = FileManager.default.currentDirectoryPath
        #expect(ProxyConfiguration.defaults.variantFiles.baseDirectory == cwd)
        #expect(ProxyConfiguration.defaults.variantFiles.directory == cwd + "/variants")
    }

    @Test("a missing variants directory is named when a file variant needs it")
    func missingDefaultDirectory() throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        _ = FileManager.default.createFile(atPath: directory + "/poster.jpg", contents: Data([1]))
        // No file variant: nothing needs the directory.
        _ = try parse("variants:\n  - {id: t, match: \"http://a.example/\", target: \"http://b.example/\"}", base: directory)
        let error = parseError(Self.fileVariant("poster.jpg"), base: directory)
        #expect(error?.key == "variants[0].file")
        #expect(error?.line == 4)
        #expect(error?.message.contains(#"the variants directory "\#(directory)/variants" does not exist"#) == true, "\(String(describing: error))")
    }

    static let badDirectories: [ErrorCase] = [
        ErrorCase("variants-dir: \"\"", key: "variants-dir", line: 1, "expected a directory path"),
        ErrorCase("variants-dir: [a, b]", key: "variants-dir", line: 1, "got a list"),
        ErrorCase("\nvariants-dir: nowhere", key: "variants-dir", line: 2, "does not exist"),
        ErrorCase("variants-dir: outside.jpg", key: "variants-dir", line: 1, "is not a directory"),
        ErrorCase("variant-dir: assets", key: "variant-dir", line: 1, #"did you mean "variants-dir"?"#),
    ]

    @Test("a bad variants-dir names its key and line", arguments: badDirectories)
    func badDirectory(_ errorCase: ErrorCase) throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        expectError(errorCase, base: directory)
    }

    @Test("the resolver used by the admin API gives the same verdicts")
    func resolverVerdicts() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let files = VariantFiles(baseDirectory: directory, directory: directory + "/variants")
        #expect(try files.resolve("variants/alias.jpg").get() == directory + "/variants/poster.jpg")
        for bad in ["../../../../etc/passwd", "/etc/passwd", "variants/escape.jpg", "variants/pipe", "variants/sub", "nope.jpg"] {
            if case .success(let path) = files.resolve(bad) { Issue.record("\(bad) accepted as \(path)") }
        }
    }
}
