import ArgumentParser
import Foundation

/// `datamode-proxy`: an HTTP forward proxy that enforces data modes (Low Data Mode on the network).
@main
struct DatamodeProxyCommand: ParsableCommand {
    /// Runtime failures print their message and exit 1; everything else is ArgumentParser's usual handling.
    static func main() {
        do {
            var command = try parseAsRoot()
            try command.run()
        } catch let failure as CommandFailure {
            FileHandle.standardError.write(Data("datamode-proxy: \(failure.description)\n".utf8))
            Foundation.exit(1)
        } catch {
            exit(withError: error)
        }
    }

    static let configuration = CommandConfiguration(
        commandName: "datamode-proxy",
        abstract: "An HTTP forward proxy that enforces data modes: Low Data Mode on the network.",
        discussion: """
            Point http_proxy at it (lowercase: curl and URLSession on Linux read only that), flip the mode with \
            `datamode-proxy mode constrained` \
            (or the admin API), and disallowed requests are refused with `constrained` or served as \
            their registered low-resolution variants.
            """,
        version: ProductVersion.string,
        subcommands: [RunCommand.self, CheckCommand.self, ModeCommand.self, VariantsCommand.self, SessionsCommand.self,
                      WatchCommand.self, CACommand.self, ConditionsCommand.self, BudgetsCommand.self,
                      TransparentRulesCommand.self, DeferredCommand.self, StatusCommand.self, ScheduleCommand.self]
    )
}

enum ProductVersion {
    static let string = "0.1.0"
}
