import ArgumentParser
import Foundation

/// `datamode-proxy schedule [AFTER=MODE ...] [--repeat] [--clear] [--session ID]`: shows, sets or clears the mode
/// timelines of a running proxy (SPEC §12 `/schedule`).
struct ScheduleCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "schedule",
        abstract: "Show, set or clear a running proxy's mode schedules (a timeline of modes, for test rigs).",
        discussion: """
            Without steps: every schedule. With steps: each AFTER=MODE is a mode that comes AFTER (500ms, 30s, 2m, \
            1h) the step before it; e.g. `schedule 0s=constrained 30s=normal --repeat` flips every 30 s. \
            A new schedule replaces the scope's old one. --clear cancels it. --session ID: a session's own timeline.
            """
    )

    @Argument(help: "Steps AFTER=MODE, in order (e.g. 0s=constrained 30s=normal).")
    var steps: [String] = []

    @Flag(name: .long, help: "Start over after the last step.")
    var `repeat` = false

    @Flag(name: .long, help: "Cancel the schedule (DELETE /schedule).")
    var clear = false

    @Option(name: .long, help: "The session whose schedule this is (default: the global mode).")
    var session: String?

    @OptionGroup var options: AdminOptions

    func validate() throws {
        if clear && !steps.isEmpty { throw ValidationError("give steps or --clear, not both") }
        if `repeat` && steps.isEmpty { throw ValidationError("--repeat goes with steps") }
        for step in steps {
            let parts = step.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
                throw ValidationError("step \"\(step)\" is not AFTER=MODE (e.g. 30s=constrained)")
            }
        }
    }

    func run() throws {
        let client = options.client
        let query = session.map { "?session=" + ($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0) } ?? ""
        do {
            if clear {
                _ = try client.check(client.request("DELETE", "/schedule" + query))
                if options.style.json { print("{}") } else { print("schedule cleared") }
                return
            }
            if steps.isEmpty {
                HumanOutput.emit(try client.check(client.request("GET", "/schedule")), options.style,
                                 as: [String: Any].self) { HumanOutput.schedules($0["schedules"] as? [[String: Any]] ?? [], $1) }
                return
            }
            var body: [String: Any] = ["repeat": `repeat`, "steps": steps.map { step -> [String: Any] in
                let parts = step.split(separator: "=", maxSplits: 1).map(String.init)
                return ["after": parts[0], "mode": parts[1]]
            }]
            if let session { body["session"] = session }
            HumanOutput.emit(try client.check(client.request("PUT", "/schedule", json: body)), options.style,
                             as: [String: Any].self) { HumanOutput.schedules([$0], $1) }
        } catch {
            throw CommandFailure(error)
        }
    }
}
