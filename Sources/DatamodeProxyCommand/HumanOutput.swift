import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// How a command prints what the admin API answered (SPEC §20): the API's JSON for scripts (`--json`, and the
/// default when stdout is not a terminal, so pipes and `jq` get what they always got), tables and aligned lines
/// for a person at a terminal; colour only on a terminal and never with `NO_COLOR` set (no-color.org).
struct OutputStyle {
    var json: Bool
    var color: Bool

    static func current(json: Bool) -> OutputStyle {
        let terminal = isatty(STDOUT_FILENO) == 1
        let noColor = !(ProcessInfo.processInfo.environment["NO_COLOR"] ?? "").isEmpty
        return OutputStyle(json: json || !terminal, color: terminal && !noColor)
    }

    func bold(_ text: String) -> String { color ? "\u{1B}[1m\(text)\u{1B}[0m" : text }
    func red(_ text: String) -> String { color ? "\u{1B}[31m\(text)\u{1B}[0m" : text }
    func dim(_ text: String) -> String { color ? "\u{1B}[2m\(text)\u{1B}[0m" : text }
}

/// Columns padded to their widest cell; the header in bold.
struct TextTable {
    var headers: [String]
    var rows: [[String]]

    func render(_ style: OutputStyle) -> String {
        guard !rows.isEmpty else { return style.dim("(none)") + "\n" }
        var widths = headers.map(\.count)
        for row in rows { for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) } }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                i == cells.count - 1 ? cell : cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }
        return style.bold(line(headers)) + "\n" + rows.map { line($0) + "\n" }.joined()
    }
}

/// The human renderings of the admin API's documents, one per endpoint a command reads.
enum HumanOutput {
    static func parse(_ body: String) -> Any? {
        try? JSONSerialization.jsonObject(with: Data(body.utf8), options: [.fragmentsAllowed])
    }

    /// Decimal units, as the configuration's `KB`/`MB` (SPEC §8).
    static func bytes(_ value: Any?) -> String {
        guard var n = (value as? NSNumber)?.doubleValue else { return "-" }
        let units = ["B", "kB", "MB", "GB", "TB"]
        var unit = 0
        while n >= 1000 && unit < units.count - 1 { n /= 1000; unit += 1 }
        return unit == 0 ? "\(Int(n)) B" : String(format: "%.1f %@", n, units[unit])
    }

    static func text(_ value: Any?) -> String {
        switch value {
        case nil, is NSNull: "-"
        case let string as String: string
        // JSONSerialization's true and false are NSNumbers too; only their class tells them from 1 and 0.
        case let number as NSNumber where String(describing: type(of: number)).contains("Boolean"):
            number.boolValue ? "yes" : "no"
        case let number as NSNumber: number.stringValue
        case let list as [Any]: list.map { text($0) }.joined(separator: ", ")
        case let object as [String: Any]:
            object.keys.sorted().map { "\($0)=\(text(object[$0]))" }.joined(separator: " ")
        default: "\(value!)"
        }
    }

    /// `name  value` lines, names aligned and bold.
    static func fields(_ pairs: [(String, String)], _ style: OutputStyle) -> String {
        let width = pairs.map(\.0.count).max() ?? 0
        return pairs.map { style.bold($0.0.padding(toLength: width, withPad: " ", startingAt: 0)) + "  " + $0.1 + "\n" }.joined()
    }

    /// Any object, its members in order of name.
    static func object(_ object: [String: Any], _ style: OutputStyle) -> String {
        fields(object.keys.sorted().map { ($0, text(object[$0])) }, style)
    }

    static func mode(_ mode: [String: Any], _ style: OutputStyle) -> String {
        var pairs = [("mode", text(mode["mode"])), ("set by", text(mode["source"]) + (mode["budget"].map { " (\(text($0)))" } ?? "")),
                     ("since", text(mode["since"])), ("profile", text(mode["profile"]))]
        if let scope = mode["scope"] { pairs.append(("scope", text(scope))) }
        return fields(pairs, style)
    }

    static func conditions(_ conditions: [String: Any], _ style: OutputStyle) -> String {
        var pairs = [("profile", text(conditions["profile"])), ("from", text(conditions["source"])),
                     ("mode", text(conditions["mode"])), ("scope", text(conditions["scope"]))]
        if let condition = conditions["condition"] { pairs.append(("condition", text(condition))) }
        if let api = conditions["apiProfile"] { pairs.append(("api profile", text(api))) }
        pairs.append(("profiles", text(conditions["profiles"])))
        return fields(pairs, style)
    }

    static func budgets(_ budgets: [[String: Any]], _ style: OutputStyle) -> String {
        TextTable(headers: ["BUDGET", "USED", "OF", "REMAINING", "PERIOD", "THEN", "RESETS", "STATE"], rows: budgets.map { b in
            [text(b["name"]), bytes(b["used"]), bytes(b["bytes"]), bytes(b["remaining"]), text(b["period"]), text(b["then"]),
             text(b["resetsAt"]), (b["spent"] as? Bool ?? false) ? style.red("spent") : "ok"]
        }).render(style)
    }

    static func sessions(_ document: [String: Any], _ style: OutputStyle) -> String {
        let sessions = document["sessions"] as? [[String: Any]] ?? []
        var out = TextTable(headers: ["SESSION", "MODE", "PROFILE", "REQUESTS", "IN", "OUT"], rows: sessions.map { s in
            let bytesDone = s["bytes"] as? [String: Any]
            return [text(s["id"]), text(s["mode"]), text(s["profile"]), text(s["requestsTotal"] ?? 0),
                    bytes(bytesDone?["in"]), bytes(bytesDone?["out"])]
        }).render(style)
        if document["enabled"] as? Bool == false { out += style.dim("sessions are off (sessions: {enabled: true})") + "\n" }
        return out
    }

    static func session(_ s: [String: Any], _ style: OutputStyle) -> String {
        let bytesDone = s["bytes"] as? [String: Any]
        var out = fields([("session", text(s["id"])), ("mode", text(s["mode"])), ("profile", text(s["profile"])),
                          ("requests", text(s["requestsTotal"] ?? 0)), ("bytes in", bytes(bytesDone?["in"])),
                          ("bytes out", bytes(bytesDone?["out"]))], style)
        let rejected = s["rejected"] as? [[String: Any]] ?? []
        if !rejected.isEmpty {
            out += "\n" + TextTable(headers: ["REFUSED AT", "ERROR", "URL"], rows: rejected.reversed().map {
                [text($0["time"]), style.red(text($0["error"])), text($0["url"])]
            }).render(style)
        }
        return out
    }

    static func deferred(_ entries: [[String: Any]], _ style: OutputStyle) -> String {
        TextTable(headers: ["ID", "STATUS", "METHOD", "BYTES", "ATTEMPTS", "QUEUED", "URL"], rows: entries.map { e in
            [text(e["id"]), text(e["status"]), text(e["method"]), bytes(e["bytes"]), text(e["attempts"]), text(e["queuedAt"]),
             text(e["url"])]
        }).render(style)
    }

    static func schedules(_ schedules: [[String: Any]], _ style: OutputStyle) -> String {
        TextTable(headers: ["SCOPE", "STEPS", "REPEAT", "NEXT"], rows: schedules.map { s in
            let steps = (s["steps"] as? [[String: Any]] ?? []).map { "\(text($0["after"])) \(text($0["mode"]))" }
            return [text(s["session"] is NSNull ? "global" : s["session"]), steps.joined(separator: " → "),
                    (s["repeat"] as? Bool ?? false) ? "yes" : "no", text(s["nextAt"] ?? s["next"])]
        }).render(style)
    }

    static func refusals(_ refusals: [[String: Any]], _ style: OutputStyle, limit: Int = 10) -> String {
        TextTable(headers: ["TIME", "CLIENT", "ERROR", "RULE", "SESSION", "REQUEST"], rows: refusals.prefix(limit).map { r in
            [text(r["time"]), text(r["client"]), style.red(text(r["reasons"])), text(r["rule"]), text(r["session"]),
             "\(text(r["method"])) \(text(r["url"]))"]
        }).render(style)
    }

    /// Prints `body` as JSON, or through `human` when it parses and the style is for people.
    static func emit<T>(_ body: String, _ style: OutputStyle, as _: T.Type = T.self, _ human: (T, OutputStyle) -> String) {
        if !style.json, let value = parse(body) as? T {
            print(human(value, style), terminator: "")
        } else {
            print(body, terminator: "")
        }
    }
}
