import ArgumentParser
import Foundation

/// `datamode-proxy status`: one screen of everything the admin page shows (SPEC §20): mode, link profile, traffic
/// of the last minute and hour, budgets, sessions, schedules, deferred uploads and the latest refusals.
struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show one screen of a running proxy's state: mode, profile, traffic, budgets, sessions, refusals.",
        discussion: """
            A section the API does not answer (sessions off, no deferral store, a read-only token) says why and the \
            others are shown. With --json (the default off a terminal): one object with a member per section.
            """
    )

    @OptionGroup var options: AdminOptions

    /// The sections in the order they are shown, each with the endpoint it reads.
    static let sections: [(name: String, path: String)] = [
        ("mode", "/mode"), ("conditions", "/conditions"), ("timeline", "/stats/timeline"), ("budgets", "/budgets"),
        ("sessions", "/sessions"), ("schedule", "/schedule"), ("deferred", "/deferred"), ("refusals", "/refusals"),
    ]

    func run() throws {
        let client = options.client
        var documents: [String: Any] = [:]
        var problems: [String: String] = [:]
        for (name, path) in Self.sections {
            do {
                let response = try client.request("GET", path)
                if (200..<300).contains(response.status), let value = HumanOutput.parse(response.body) {
                    documents[name] = value
                } else {
                    let detail = (HumanOutput.parse(response.body) as? [String: Any])?["detail"] as? String
                    problems[name] = "\(response.status): \(detail ?? response.body)"
                }
            } catch {
                // The proxy is not there at all: one error, not eight.
                throw CommandFailure(error)
            }
        }
        let style = options.style
        if style.json {
            var object = documents
            for (name, problem) in problems { object[name] = ["unavailable": problem] }
            if let timeline = documents["timeline"] as? [String: Any] {
                object["timeline"] = nil
                object["traffic"] = Self.traffic(timeline)
            }
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        print(render(documents, problems, style), terminator: "")
    }

    /// Bytes in, out and saved over the last minute and the last hour of the timeline.
    static func traffic(_ timeline: [String: Any]) -> [String: Any] {
        let points = timeline["points"] as? [[String: Any]] ?? []
        let newest = points.compactMap { $0["t"] as? Int }.max() ?? 0
        func sum(_ seconds: Int) -> [String: Int] {
            var total = ["bytesIn": 0, "bytesOut": 0, "saved": 0]
            for point in points where (point["t"] as? Int ?? 0) > newest - seconds {
                total["bytesIn"]! += point["bytesIn"] as? Int ?? 0
                total["bytesOut"]! += point["bytesOut"] as? Int ?? 0
                total["saved"]! += (point["saved"] as? [String: Int] ?? [:]).values.reduce(0, +)
            }
            return total
        }
        return ["lastMinute": sum(60), "lastHour": sum(3600)]
    }

    func render(_ documents: [String: Any], _ problems: [String: String], _ style: OutputStyle) -> String {
        func heading(_ title: String) -> String { "\n" + style.bold(title) + "\n" }
        func unavailable(_ name: String) -> String { style.dim("(\(problems[name] ?? "unavailable"))") + "\n" }
        var out = style.bold("datamode-proxy") + " at \(options.client.address)\n\n"
        var pairs: [(String, String)] = []
        if let mode = documents["mode"] as? [String: Any] {
            pairs.append(("mode", "\(HumanOutput.text(mode["mode"])) (set by \(HumanOutput.text(mode["source"])) since \(HumanOutput.text(mode["since"])))"))
        } else {
            pairs.append(("mode", problems["mode"] ?? "-"))
        }
        if let conditions = documents["conditions"] as? [String: Any] {
            pairs.append(("profile", HumanOutput.text(conditions["profile"] is NSNull ? "no shaping" : conditions["profile"])))
        }
        if let timeline = documents["timeline"] as? [String: Any] {
            let traffic = Self.traffic(timeline)
            for (label, key) in [("last minute", "lastMinute"), ("last hour", "lastHour")] {
                let t = traffic[key] as? [String: Int] ?? [:]
                pairs.append((label, "\(HumanOutput.bytes(t["bytesIn"])) in, \(HumanOutput.bytes(t["bytesOut"])) out, "
                                     + "\(HumanOutput.bytes(t["saved"])) saved"))
            }
        }
        out += HumanOutput.fields(pairs, style)
        out += heading("Budgets")
        if let budgets = documents["budgets"] as? [[String: Any]] { out += HumanOutput.budgets(budgets, style) } else { out += unavailable("budgets") }
        out += heading("Sessions")
        if let sessions = documents["sessions"] as? [String: Any] { out += HumanOutput.sessions(sessions, style) } else { out += unavailable("sessions") }
        out += heading("Schedules")
        if let schedule = documents["schedule"] as? [String: Any] {
            out += HumanOutput.schedules(schedule["schedules"] as? [[String: Any]] ?? [], style)
        } else {
            out += unavailable("schedule")
        }
        out += heading("Deferred uploads")
        if let deferred = documents["deferred"] as? [[String: Any]] { out += HumanOutput.deferred(Array(deferred.prefix(10)), style) } else { out += unavailable("deferred") }
        out += heading("Latest refusals")
        if let refusals = (documents["refusals"] as? [String: Any])?["refusals"] as? [[String: Any]] {
            out += HumanOutput.refusals(refusals, style)
        } else {
            out += unavailable("refusals")
        }
        return out
    }
}
