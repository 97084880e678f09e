import ArgumentParser
import Foundation

/// `datamode-proxy budgets [--reset NAME]`: shows the data budgets of a running proxy, or resets one (SPEC §11).
struct BudgetsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "budgets",
        abstract: "Show the data budgets of a running proxy (used, remaining, resetsAt, spent), or reset one.",
        discussion: "--reset NAME makes the budget's whole allowance available again for the rest of its period."
    )

    @Option(name: .long, help: "Reset this budget (POST /budgets/NAME/reset).")
    var reset: String?

    @OptionGroup var options: AdminOptions

    func run() throws {
        let client = options.client
        do {
            let response: AdminClient.Response
            if let reset {
                let name = reset.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? reset
                response = try client.request("POST", "/budgets/\(name)/reset")
            } else {
                response = try client.request("GET", "/budgets")
            }
            print(try client.check(response), terminator: "")
        } catch {
            throw CommandFailure(error)
        }
    }
}
