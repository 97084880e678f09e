import DatamodeConfig
import DatamodePolicy
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The admin API's persistent state in `state-dir` (SPEC §7): `mode.json` and `variants.json`.
///
/// Every write is atomic: a temporary file in the same directory is written and fsynced, renamed over the
/// old one, and the directory is fsynced, so a crash at any moment leaves the old or the new file, never a
/// torn or empty one. A file that exists but cannot be read or parsed is an error naming it: state an
/// operator set is never silently dropped.
public final class StateStore: @unchecked Sendable {
    public let directory: String

    public struct StateError: Error, CustomStringConvertible {
        public var description: String
        /// The shared store could not be reached in time (SPEC §19): nothing was changed, anywhere (`503
        /// store-unavailable`), rather than this proxy alone.
        public var unavailable: Bool
        public init(description: String, unavailable: Bool = false) {
            self.description = description
            self.unavailable = unavailable
        }
    }

    /// Contents handed to a loader instead of its file: what the shared store holds (nil: no value), and where
    /// it came from for error messages (a Redis key).
    public struct Given {
        public var bytes: [UInt8]?
        public var origin: String
        public init(bytes: [UInt8]?, origin: String) {
            self.bytes = bytes
            self.origin = origin
        }
    }

    /// The shared store (SPEC §19 `store.kind: redis`): a write of a followed file goes there first, and only once
    /// it is there to the local file, which is then the last state known (what a start with the store down uses).
    /// nil: the state directory is the store. Set once, before the admin API serves.
    public var shared: (any SharedStateWriter)?

    public init(directory: String) throws(StateError) {
        self.directory = directory
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw StateError(description: "state-dir \(directory) is not a directory") }
        } else {
            do {
                // 0700: the local CA's key lives here by default (SPEC §9).
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw StateError(description: "cannot create state-dir \(directory): \(error.localizedDescription)")
            }
        }
        // Temporaries of writes cut short by a crash: the real files are whole (rename is atomic), these are litter.
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.contains(".json.tmp.") {
            unlink(directory + "/" + name)
        }
    }

    /// The files another process may write for this one to follow (SPEC §19 `store.kind: file`), by name.
    public static let followedFiles: Set<String> = ["mode.json", "variants.json", "conditions.json"]

    /// Whether a change of the directory entry `name` may change a followed file: one of them, or an entry of a
    /// Kubernetes ConfigMap volume (`..data`, the symlink swapped to publish a new version, and its `..` siblings).
    /// Temporaries, budget usage and the deferral store are this process's own business.
    public static func mayChangeFollowedFiles(_ name: String) -> Bool {
        followedFiles.contains(name) || name.hasPrefix("..")
    }

    /// The bytes of each followed file as this process last wrote or read it (`.some(nil)`: absent), so that a
    /// change seen in the directory is told apart from this process's own write. Control plane only.
    private var known: [String: [UInt8]?] = [:]

    /// Whether the file at `path` differs from what this process last wrote or read there (it appeared, went, or
    /// holds other bytes). Follows symlinks, as a reader does.
    public func changedSinceKnown(_ path: String) -> Bool {
        guard let last = known[path] else { return true }
        return Self.contents(path) != last
    }

    /// The file's bytes, or nil when there is none (or it cannot be opened).
    private static func contents(_ path: String) -> [UInt8]? {
        FileManager.default.contents(atPath: path).map { Array($0) }
    }

    public var modePath: String { directory + "/mode.json" }
    public var variantsPath: String { directory + "/variants.json" }

    // MARK: mode

    /// The persisted API mode, or nil when none was set. The file holds the mode's name, so one written before
    /// the ultra-constrained condition existed (SPEC §15) names one of the four old modes and reads as that mode
    /// without it.
    public func loadMode(_ given: Given? = nil) throws(StateError) -> (mode: DataMode, since: Int64)? {
        guard let object = try readObject(modePath, given) else { return nil }
        guard let name = object["mode"] as? String, let mode = DataMode(name: name) else {
            throw StateError(description: "\(given?.origin ?? modePath): \"mode\" is missing or not a mode name; fix or delete \(given == nil ? "the file" : "it")")
        }
        let since = (object["since"] as? NSNumber)?.int64Value ?? 0
        return (mode, since)
    }

    public func saveMode(_ mode: DataMode, since: Int64) throws(StateError) {
        try writeAtomically(modePath, ["mode": mode.name, "since": since])
    }

    public func deleteMode() throws(StateError) {
        try share(modePath, nil)
        if unlink(modePath) != 0 && errno != ENOENT {
            throw StateError(description: "cannot remove \(modePath): \(String(cString: strerror(errno)))")
        }
        known[modePath] = .some(nil)
        syncDirectory()
    }

    // MARK: link profile (SPEC §10)

    public var conditionsPath: String { directory + "/conditions.json" }

    /// The link profile set with `PUT /conditions`, or nil.
    public func loadProfile(_ given: Given? = nil) throws(StateError) -> String? {
        guard let object = try readObject(conditionsPath, given) else { return nil }
        guard let name = object["profile"] as? String, !name.isEmpty else {
            throw StateError(description: "\(given?.origin ?? conditionsPath): \"profile\" is missing or not a name; fix or delete \(given == nil ? "the file" : "it")")
        }
        return name
    }

    public func saveProfile(_ name: String) throws(StateError) {
        try writeAtomically(conditionsPath, ["profile": name])
    }

    public func deleteProfile() throws(StateError) {
        try share(conditionsPath, nil)
        if unlink(conditionsPath) != 0 && errno != ENOENT {
            throw StateError(description: "cannot remove \(conditionsPath): \(String(cString: strerror(errno)))")
        }
        known[conditionsPath] = .some(nil)
        syncDirectory()
    }

    // MARK: budgets (SPEC §11)

    public var budgetsPath: String { directory + "/budgets.json" }

    /// Persisted budget usage by name: the period's start (UTC seconds) and the bytes used in it.
    public func loadBudgetUsage() throws(StateError) -> [String: (start: Int64, used: UInt64)] {
        guard let object = try readObject(budgetsPath) else { return [:] }
        guard let entries = object["budgets"] as? [String: Any] else {
            throw StateError(description: "\(budgetsPath): \"budgets\" is missing or not an object; fix or delete the file")
        }
        var usage: [String: (start: Int64, used: UInt64)] = [:]
        for (name, value) in entries {
            guard let entry = value as? [String: Any], let start = (entry["periodStart"] as? NSNumber)?.int64Value,
                  let used = (entry["used"] as? NSNumber)?.uint64Value else {
                throw StateError(description: "\(budgetsPath): budget \"\(name)\" needs periodStart and used; fix or delete the file")
            }
            usage[name] = (start, used)
        }
        return usage
    }

    public func saveBudgetUsage(_ usage: [(name: String, start: Int64, used: UInt64)]) throws(StateError) {
        var entries: [String: Any] = [:]
        for entry in usage { entries[entry.name] = ["periodStart": entry.start, "used": entry.used] }
        try writeAtomically(budgetsPath, ["budgets": entries])
    }

    /// A fleet's budget hashes (SPEC §19, `store.kind: redis`) as this proxy last saw them: per budget, the period's
    /// start and every field's value (each proxy's share, `reset`, `legacy`). What a restarted proxy seeds a Redis
    /// that came back empty with, so no budget starts over even when every proxy of the fleet restarted too. Kept
    /// with the fleet's key prefix: shares saved for another prefix (another fleet) are not read.
    public var budgetSharesPath: String { directory + "/budget-shares.json" }

    public func loadBudgetShares(keyPrefix: String) throws(StateError) -> [String: (start: Int64, fields: [String: UInt64])] {
        guard let object = try readObject(budgetSharesPath) else { return [:] }
        guard object["keyPrefix"] as? String == keyPrefix else { return [:] }
        guard let entries = object["budgets"] as? [String: Any] else {
            throw StateError(description: "\(budgetSharesPath): \"budgets\" is missing or not an object; fix or delete the file")
        }
        var shares: [String: (start: Int64, fields: [String: UInt64])] = [:]
        for (name, value) in entries {
            guard let entry = value as? [String: Any], let start = (entry["periodStart"] as? NSNumber)?.int64Value,
                  let fields = entry["shares"] as? [String: Any] else {
                throw StateError(description: "\(budgetSharesPath): budget \"\(name)\" needs periodStart and shares; fix or delete the file")
            }
            var values: [String: UInt64] = [:]
            for (field, number) in fields {
                guard let number = (number as? NSNumber)?.uint64Value else {
                    throw StateError(description: "\(budgetSharesPath): budget \"\(name)\": share \"\(field)\" is not a number; fix or delete the file")
                }
                values[field] = number
            }
            shares[name] = (start, values)
        }
        return shares
    }

    public func saveBudgetShares(_ shares: [(name: String, start: Int64, fields: [String: UInt64])],
                                 keyPrefix: String) throws(StateError) {
        var entries: [String: Any] = [:]
        for entry in shares { entries[entry.name] = ["periodStart": entry.start, "shares": entry.fields] }
        try writeAtomically(budgetSharesPath, ["keyPrefix": keyPrefix, "budgets": entries])
    }

    // MARK: variants

    /// The persisted API variants. Each is checked as a new `PUT` would be, `file`s against `files`: a variant
    /// that no longer passes (its file is gone, or lies outside the variants directory, as one written before
    /// `variants-dir` existed may) stops start-up with an error naming this file, rather than being dropped.
    public func loadVariants(files: VariantFiles, _ given: Given? = nil) throws(StateError) -> [Variant] {
        let variantsPath = given?.origin ?? self.variantsPath
        guard let object = try readObject(self.variantsPath, given) else { return [] }
        guard let list = object["variants"] as? [[String: Any]] else {
            throw StateError(description: "\(variantsPath): \"variants\" is missing or not a list; fix or delete the file")
        }
        var variants: [Variant] = []
        for item in list {
            guard let id = item["id"] as? String else {
                throw StateError(description: "\(variantsPath): a variant has no \"id\"")
            }
            var fields = item
            fields.removeValue(forKey: "source")
            let body = (try? JSONSerialization.data(withJSONObject: fields)) ?? Data()
            switch VariantJSON.parse(Array(body), id: id, files: files) {
            case .success(let variant): variants.append(variant)
            case .failure(let failure):
                throw StateError(description: "\(variantsPath): variant \"\(id)\": \(failure.detail); fix or delete the file")
            }
        }
        return variants
    }

    /// Checks that the file of every API file variant still passes against `files`: a reload of the config
    /// file may move the variants directory, and an API variant left outside it must not keep being served.
    public func checkFiles(of variants: [Variant], against files: VariantFiles) throws(StateError) {
        for variant in variants {
            guard case .file(let path, _) = variant.resource, variant.source == .api else { continue }
            if case .failure(let problem) = files.resolve(path) {
                throw StateError(description: "\(variantsPath): API variant \"\(variant.id)\": \(problem); "
                    + "delete it (DELETE /variants/\(variant.id)) or keep its file inside the variants directory")
            }
        }
    }

    public func saveVariants(_ variants: [Variant]) throws(StateError) {
        var text = "{\n  \"variants\" : [\n"
        text += variants.map { "    " + VariantJSON.text($0) }.joined(separator: ",\n")
        text += "\n  ]\n}\n"
        try writeAtomically(variantsPath, bytes: Array(text.utf8))
    }

    // MARK: files

    private func readObject(_ path: String, _ given: Given? = nil) throws(StateError) -> [String: Any]? {
        if let given {
            guard let bytes = given.bytes else { return nil }
            guard let object = (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] else {
                throw StateError(description: "\(given.origin): not a JSON object")
            }
            return object
        }
        guard FileManager.default.fileExists(atPath: path) else {
            known[path] = .some(nil)
            return nil
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw StateError(description: "\(path): cannot be read")
        }
        // Known even when refused below: the refusal is logged once, not again at every change of the directory.
        known[path] = .some(Array(data))
        guard let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
            throw StateError(description: "\(path): not a JSON object (corrupt?); fix or delete the file to start")
        }
        return object
    }

    private func writeAtomically(_ path: String, _ object: [String: Any]) throws(StateError) {
        let data: Data
        do {
            data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes])
        } catch {
            throw StateError(description: "cannot encode state for \(path): \(error)")
        }
        try writeAtomically(path, bytes: Array(data) + [0x0a])
    }

    private func writeAtomically(_ path: String, bytes: [UInt8], sharing: Bool = true) throws(StateError) {
        if sharing { try share(path, bytes) }
        let temporary = "\(path).tmp.\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StateError(description: "cannot create \(temporary): \(String(cString: strerror(errno)))") }
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + written, bytes.count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                let reason = String(cString: strerror(errno))
                close(fd)
                unlink(temporary)
                throw StateError(description: "cannot write \(temporary): \(reason)")
            }
            written += n
        }
        guard fsync(fd) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            unlink(temporary)
            throw StateError(description: "cannot fsync \(temporary): \(reason)")
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw StateError(description: "cannot rename \(temporary) to \(path): \(reason)")
        }
        known[path] = .some(bytes)
        syncDirectory()
    }

    /// Hands a followed file's new contents (nil: removed) to the shared store first, when there is one.
    private func share(_ path: String, _ bytes: [UInt8]?) throws(StateError) {
        guard let shared else { return }
        let name = String(path.split(separator: "/").last ?? "")
        guard Self.followedFiles.contains(name) else { return }
        try shared.share(name, bytes)
    }

    /// Writes what the shared store holds for `name` to the local file (nil: removes it), without sharing it back:
    /// the last state known, for a start while the store is down.
    public func cache(_ name: String, _ bytes: [UInt8]?) throws(StateError) {
        precondition(Self.followedFiles.contains(name), "only followed files are cached")
        let path = directory + "/" + name
        if let bytes {
            guard known[path] != .some(bytes) else { return }
            try writeAtomically(path, bytes: bytes, sharing: false)
        } else {
            if unlink(path) != 0 && errno != ENOENT {
                throw StateError(description: "cannot remove \(path): \(String(cString: strerror(errno)))")
            }
            known[path] = .some(nil)
        }
    }

    /// The local file's bytes for `name` (nil: none): what this proxy seeds an empty shared store with.
    public func localBytes(_ name: String) -> [UInt8]? {
        Self.contents(directory + "/" + name)
    }

    /// Makes the rename itself durable.
    private func syncDirectory() {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 {
            fsync(fd)
            close(fd)
        }
    }
}

/// The shared store behind `StateStore.shared` (SPEC §19): implemented over Redis by the instance.
public protocol SharedStateWriter: AnyObject, Sendable {
    /// Stores `value` for the followed file `name` (nil: removes it) where every proxy reads it, and tells them.
    /// Throws a `StateError` with `unavailable` when the store cannot take it in time: then nothing changed.
    func share(_ name: String, _ value: [UInt8]?) throws(StateStore.StateError)

    /// Stores session `id`'s value (SPEC §12; nil: deletes the session, and its schedule) where every proxy reads
    /// it, living `lifetime` unless a proxy refreshes it, and tells them. Setting a session cancels its schedule.
    /// Throws `unavailable` as `share` does.
    func shareSession(_ id: String, _ value: [UInt8]?, lifetime: Duration) throws(StateStore.StateError)

    /// Stores the schedule of `scope` (`global` or a session id; nil: cancels it) where every proxy reads it,
    /// and tells them. Throws `unavailable` as `share` does.
    func shareSchedule(_ scope: String, _ value: [UInt8]?) throws(StateStore.StateError)

    /// Gives the sessions `ids` their whole `lifetime` again (they were used here): a session used on any proxy
    /// does not expire. Sent without waiting; a Redis that cannot take it loses nothing the next refresh cannot.
    func refreshSessions(_ ids: [String], lifetime: Duration)
}
