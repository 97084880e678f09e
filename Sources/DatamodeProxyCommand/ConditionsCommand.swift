import ArgumentParser
import Foundation

/// `datamode-proxy conditions [NAME | --reset]`: shows or sets the link profile of a running proxy (SPEC §10).
struct ConditionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conditions",
        abstract: "Show or set the link profile (bandwidth and latency) of a running proxy.",
        discussion: """
            NAME: a built-in profile (devtools-3g, devtools-slow-4g, devtools-fast-4g, nlc-3g, nlc-dsl, nlc-lte, \
            nlc-very-bad-network, geo-satellite) or one of the config file's profiles. A profile set here beats \
            the one the mode brings (conditions.<condition>.profile) until --reset.
            """
    )

    @Argument(help: "The profile to put in force; omit to show the current one.")
    var name: String?

    @Flag(name: .long, help: "Forget the profile set through the API (DELETE /conditions).")
    var reset = false

    @OptionGroup var options: AdminOptions

    func validate() throws {
        if reset && name != nil { throw ValidationError("give a profile name or --reset, not both") }
    }

    func run() throws {
        let client = options.client
        do {
            let response: AdminClient.Response
            if reset {
                response = try client.request("DELETE", "/conditions")
            } else if let name {
                response = try client.request("PUT", "/conditions", json: ["profile": name])
            } else {
                response = try client.request("GET", "/conditions")
            }
            HumanOutput.emit(try client.check(response), options.style, as: [String: Any].self, HumanOutput.conditions)
        } catch {
            throw CommandFailure(error)
        }
    }
}
