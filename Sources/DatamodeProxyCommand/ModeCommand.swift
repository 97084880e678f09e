import Foundation
import ArgumentParser
import DatamodePolicy

/// `datamode-proxy mode [NAME]`: shows or sets the running proxy's data mode through the admin API.
struct ModeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mode",
        abstract: "Show or set the data mode of a running proxy.",
        discussion: """
            NAME: normal, constrained, expensive, constrained-expensive, ultra-constrained, \
            constrained-ultra-constrained, expensive-ultra-constrained, constrained-expensive-ultra-constrained \
            (aliases low-data = constrained, cellular = expensive, satellite = all three). \
            Under ultra-constrained (a satellite-class link) only requests that opt in \
            (Allow-Ultra-Constrained: ?1, or a rule) are forwarded. \
            --reset returns to the flag/config mode.
            """
    )

    @Argument(help: "The mode to set; omit to show the current one.")
    var name: String?

    @Flag(name: .long, help: "Forget the mode set through the API (DELETE /mode).")
    var reset = false

    @OptionGroup var options: AdminOptions

    func validate() throws {
        if let name, DataMode(name: name) == nil {
            throw ValidationError("unknown mode \"\(name)\"; use one of \(DataMode.acceptedNames.joined(separator: ", "))")
        }
        if reset && name != nil { throw ValidationError("give a mode name or --reset, not both") }
    }

    func run() throws {
        let client = options.client
        do {
            let response: AdminClient.Response
            if reset {
                response = try client.request("DELETE", "/mode")
            } else if let name {
                response = try client.request("PUT", "/mode", json: ["mode": name])
            } else {
                response = try client.request("GET", "/mode")
            }
            HumanOutput.emit(try client.check(response), options.style, as: [String: Any].self, HumanOutput.mode)
        } catch {
            throw CommandFailure(error)
        }
    }
}

/// `datamode-proxy variants list|add|remove`.
struct VariantsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "variants",
        abstract: "List, add or remove low-resolution variants of a running proxy.",
        subcommands: [List.self, Add.self, Remove.self]
    )

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List every variant (config and API).")
        @OptionGroup var options: AdminOptions
        func run() throws {
            let client = options.client
            do { print(try client.check(client.request("GET", "/variants")), terminator: "") } catch { throw CommandFailure(error) }
        }
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create or replace an API variant.")
        @Argument(help: "The variant id.") var id: String
        @Option(help: "Absolute URL pattern; each * is captured as $1..$9.") var match: String
        @Option(help: "Target URL (may use $1..$9).") var target: String?
        @Option(help: "A local file to serve instead, inside the proxy's variants-dir (a relative path is relative to the proxy's config directory).")
        var file: String?
        @Option(name: .customLong("content-type"), help: "Content type of a file variant.") var contentType: String?
        @Option(help: "disallowed (default), constrained, expensive, ultra-constrained or always.") var when: String?
        @Option(help: "forward (default) or redirect, for target variants.") var action: String?
        @OptionGroup var options: AdminOptions

        func validate() throws {
            if (target == nil) == (file == nil) { throw ValidationError("give exactly one of --target or --file") }
        }

        func run() throws {
            var body: [String: Any] = ["match": match]
            if let target { body["target"] = target }
            if let file { body["file"] = file }
            if let contentType { body["content-type"] = contentType }
            if let when { body["when"] = when }
            if let action { body["action"] = action }
            let client = options.client
            let path = "/variants/" + (id.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? id)
            do { print(try client.check(client.request("PUT", path, json: body)), terminator: "") } catch { throw CommandFailure(error) }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove an API variant.")
        @Argument(help: "The variant id.") var id: String
        @OptionGroup var options: AdminOptions
        func run() throws {
            let client = options.client
            let path = "/variants/" + (id.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? id)
            do { print(try client.check(client.request("DELETE", path)), terminator: "") } catch { throw CommandFailure(error) }
        }
    }
}
