import DatamodeConfig
import DatamodePolicy
import Testing

/// SPEC §2: the admin API's mode, then `--mode` / `DATAMODE_MODE`, then the file, then `normal`.
@Suite("Mode resolution")
struct ModeResolutionTests {
    static let constrained = DataMode(constrained: true, expensive: false)
    static let expensive = DataMode(constrained: false, expensive: true)
    static let both = DataMode(constrained: true, expensive: true)

    struct Case: Sendable, CustomTestStringConvertible {
        var api: DataMode?
        var flag: DataMode?
        var file: DataMode?
        var mode: DataMode
        var source: ModeSource
        var testDescription: String {
            "api \(api?.name ?? "-"), flag \(flag?.name ?? "-"), file \(file?.name ?? "-") -> \(mode.name) (\(source))"
        }
    }

    @Test("the highest input that is set wins", arguments: [
        Case(api: nil, flag: nil, file: nil, mode: .normal, source: .default),
        Case(api: nil, flag: nil, file: constrained, mode: constrained, source: .config),
        Case(api: nil, flag: nil, file: .normal, mode: .normal, source: .config),
        Case(api: nil, flag: expensive, file: nil, mode: expensive, source: .flag),
        Case(api: nil, flag: expensive, file: constrained, mode: expensive, source: .flag),
        Case(api: nil, flag: .normal, file: constrained, mode: .normal, source: .flag),
        Case(api: both, flag: nil, file: nil, mode: both, source: .api),
        Case(api: both, flag: expensive, file: constrained, mode: both, source: .api),
        // An API `normal` is a choice, not an absence: it beats a restrictive flag and file.
        Case(api: .normal, flag: expensive, file: constrained, mode: .normal, source: .api),
    ])
    func precedence(_ row: Case) {
        let resolution = ModeResolution(api: row.api, flag: row.flag, file: row.file)
        #expect(resolution.mode == row.mode)
        #expect(resolution.source == row.source)
    }

    @Test("a configuration's mode is the flag's when an override set it, else the file's", arguments: [
        // (file YAML mode, DATAMODE_MODE, API mode) -> (mode, source)
        (nil, nil, nil, "normal", ModeSource.default),
        ("constrained", nil, nil, "constrained", .config),
        ("constrained", "cellular", nil, "expensive", .flag),
        (nil, "low-data", nil, "constrained", .flag),
        ("constrained", "cellular", "normal", "normal", .api),
        (nil, nil, "constrained-expensive", "constrained-expensive", .api),
    ] as [(String?, String?, String?, String, ModeSource)])
    func fromConfiguration(_ fileMode: String?, _ envMode: String?, _ apiMode: String?, _ mode: String,
                           _ source: ModeSource) throws {
        let file = try parse(fileMode.map { "mode: \($0)" } ?? "")
        let configuration = try file.applying(.fromEnvironment(envMode.map { ["DATAMODE_MODE": $0] } ?? [:]))
        let resolution = ModeResolution(api: apiMode.flatMap { DataMode(name: $0) }, configuration: configuration)
        #expect(resolution.mode.name == mode)
        #expect(resolution.source == source)
        if apiMode == nil {
            #expect(configuration.effectiveMode == resolution.mode)
            #expect(configuration.modeSource == resolution.source)
        }
    }

    struct SinceCase: Sendable, CustomTestStringConvertible {
        var what: String
        var previous: (DataMode, ModeSource)
        var next: ModeResolution
        var moves: Bool
        var testDescription: String { what }
    }

    /// `since` says when the mode in force last changed (SPEC §7); 100 is the old value, 200 now.
    @Test("since moves when the mode changes or passes to or from the admin API", arguments: [
        SinceCase(what: "a reload that keeps the file's mode", previous: (constrained, .config),
                  next: ModeResolution(file: constrained), moves: false),
        SinceCase(what: "a reload that changes the file's mode", previous: (constrained, .config),
                  next: ModeResolution(file: expensive), moves: true),
        SinceCase(what: "a reload that moves the same mode from the file to the default", previous: (.normal, .config),
                  next: ModeResolution(), moves: false),
        SinceCase(what: "a reload under an API mode", previous: (both, .api),
                  next: ModeResolution(api: both, file: expensive), moves: false),
        SinceCase(what: "PUT of the mode the file already gave", previous: (constrained, .config),
                  next: ModeResolution(api: constrained, file: constrained), moves: true),
        SinceCase(what: "PUT of the API mode already in force", previous: (constrained, .api),
                  next: ModeResolution(api: constrained), moves: false),
        SinceCase(what: "PUT of another mode", previous: (constrained, .api),
                  next: ModeResolution(api: expensive), moves: true),
        SinceCase(what: "DELETE back to the same mode from a flag", previous: (expensive, .api),
                  next: ModeResolution(flag: expensive), moves: true),
        SinceCase(what: "DELETE with no API mode set", previous: (expensive, .flag),
                  next: ModeResolution(flag: expensive), moves: false),
    ])
    func since(_ row: SinceCase) {
        let since = row.next.since(replacing: row.previous.0, from: row.previous.1, since: 100, now: 200)
        #expect(since == (row.moves ? 200 : 100))
    }
}
