import ArgumentParser
import DatamodePolicy
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `datamode-proxy sessions [ID] [--mode NAME] [--profile P] [--delete]` (SPEC §12).
struct SessionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessions",
        abstract: "List, show, set or delete the sessions of a running proxy (test rigs, SPEC §12).",
        discussion: """
            Without ID: every session with its mode and counters. With ID: that session; with --mode (and \
            --profile) it is created or changed; with --delete it is removed and its final counters printed. \
            Requests join a session with the header Data-Mode-Session: ID (sessions.enabled must be true; while it \
            is false, setting a session fails with 409 sessions-disabled).
            """
    )

    @Argument(help: "The session id.")
    var id: String?

    @Option(name: .long, help: "Set the session's mode (a mode name, as for `mode`).")
    var mode: String?

    @Option(name: .long, help: "The session's link profile (with --mode).")
    var profile: String?

    @Flag(name: .long, help: "Delete the session.")
    var delete = false

    @OptionGroup var options: AdminOptions

    func validate() throws {
        if let mode, DataMode(name: mode) == nil {
            throw ValidationError("unknown mode \"\(mode)\"; use one of \(DataMode.acceptedNames.joined(separator: ", "))")
        }
        if (mode != nil || profile != nil || delete) && id == nil { throw ValidationError("name the session: sessions ID ...") }
        if delete && (mode != nil || profile != nil) { throw ValidationError("--delete takes no --mode or --profile") }
        if profile != nil && mode == nil { throw ValidationError("--profile goes with --mode") }
    }

    func run() throws {
        let client = options.client
        do {
            let response: AdminClient.Response
            if let id {
                let path = "/sessions/" + (id.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(["/"])) ?? id)
                if delete {
                    response = try client.request("DELETE", path)
                } else if let mode {
                    var body: [String: Any] = ["mode": mode]
                    if let profile { body["profile"] = profile }
                    response = try client.request("PUT", path, json: body)
                } else {
                    response = try client.request("GET", path)
                }
                HumanOutput.emit(try client.check(response), options.style, as: [String: Any].self, HumanOutput.session)
            } else {
                HumanOutput.emit(try client.check(client.request("GET", "/sessions")), options.style,
                                 as: [String: Any].self, HumanOutput.sessions)
            }
        } catch {
            throw CommandFailure(error)
        }
    }
}

/// `datamode-proxy watch [--session ID]`: follows `GET /events` and prints one line per event (SPEC §12).
struct WatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print the events of a running proxy as they happen (mode, conditions, budget, variants, reload).",
        discussion: """
            Each line is the event type and its JSON data. The current mode comes first. Stops with Ctrl-C; exits 1 \
            with a message when the stream ends (the proxy stopped, or the connection dropped).
            """
    )

    @Option(name: .long, help: "Follow one session's scope only.")
    var session: String?

    @OptionGroup var options: AdminOptions

    func run() throws {
        var path = "/events"
        if let session { path += "?session=" + (session.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? session) }
        do {
            try options.client.follow(path) { type, data in
                print("\(type) \(data)")
                fflush(nil)  // one line per event, as it happens, also into a pipe
            }
        } catch {
            throw CommandFailure(error)
        }
        // The proxy never ends a stream on its own: it stopped, restarted or was cut off. A watcher (a test rig, a
        // script waiting for an event) must not take that for a clean end.
        throw CommandFailure("the event stream from \(options.client.address) ended: the proxy stopped or the connection dropped")
    }
}
