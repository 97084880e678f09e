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
            if let reset {
                let name = reset.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? reset
                HumanOutput.emit(try client.check(client.request("POST", "/budgets/\(name)/reset")), options.style,
                                 as: [String: Any].self) { HumanOutput.budgets([$0], $1) }
            } else {
                HumanOutput.emit(try client.check(client.request("GET", "/budgets")), options.style,
                                 as: [[String: Any]].self, HumanOutput.budgets)
            }
        } catch {
            throw CommandFailure(error)
        }
    }
}
