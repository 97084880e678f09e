import ArgumentParser
import Foundation

/// `datamode-proxy deferred [list | cancel ID | flush]`: the stored uploads of a running proxy (SPEC §18.3).
struct DeferredCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deferred",
        abstract: "List the uploads a running proxy stored to deliver later, cancel one, or deliver all now.",
        discussion: """
            list (the default): every stored upload with its status (queued, delivering, delivered, failed, expired, \
            cancelled), attempts and last error. cancel ID: an upload still queued is never delivered. flush: every \
            queued upload is delivered now, whatever the mode (for test rigs).
            """
    )

    @Argument(help: "list, cancel or flush.")
    var action: String = "list"

    @Argument(help: "The upload's id (its Data-Mode-Deferred), for cancel.")
    var id: String?

    @OptionGroup var options: AdminOptions

    func validate() throws {
        switch action {
        case "list", "flush":
            guard id == nil else { throw ValidationError("\(action) takes no id") }
        case "cancel":
            guard let id, !id.isEmpty else { throw ValidationError("cancel needs the upload's id") }
        default:
            throw ValidationError("unknown action \"\(action)\": use list, cancel ID or flush")
        }
    }

    func run() throws {
        let client = options.client
        do {
            switch action {
            case "cancel":
                let encoded = id!.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? id!
                HumanOutput.emit(try client.check(client.request("DELETE", "/deferred/\(encoded)")), options.style,
                                 as: [String: Any].self, HumanOutput.object)
            case "flush":
                HumanOutput.emit(try client.check(client.request("POST", "/deferred/flush")), options.style,
                                 as: [String: Any].self, HumanOutput.object)
            default:
                HumanOutput.emit(try client.check(client.request("GET", "/deferred")), options.style,
                                 as: [[String: Any]].self, HumanOutput.deferred)
            }
        } catch {
            throw CommandFailure(error)
        }
    }
}
