import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// What one look at the state directory did (SPEC §19 `store.kind: file`), file by file.
public struct StateFollowOutcome: Sendable, Equatable {
    /// Followed files whose new contents are in force now (`mode.json`, `variants.json`, `conditions.json`).
    public var applied: [String] = []
    /// Followed files that changed but were refused (malformed, unknown profile, a variant that does not compile);
    /// the running state is kept.
    public var refused: [String] = []
    public init() {}
}

extension AdminAPI {
    /// Applies what another process wrote to the state directory: the API mode, the API variants and the link
    /// profile (SPEC §19 `store.kind: file`: an operator's `echo > mode.json && mv`, a ConfigMap mounted there).
    ///
    /// Each followed file that differs from what this process last wrote or read is parsed as strictly as at
    /// start-up. A valid one is put in force exactly as the matching admin write would (`PUT`/`DELETE /mode`
    /// cancels the global schedule; events are emitted); a malformed one is refused with a log line naming the
    /// file, and the running state is kept — unlike at start-up, where such a file stops the proxy, a running
    /// proxy has a state worth keeping. The caller serialises this with admin requests (the control plane).
    @discardableResult
    public func followStateDirectory() -> StateFollowOutcome {
        var outcome = StateFollowOutcome()
        func refuse(_ path: String, _ error: StateStore.StateError) {
            logger.error("state file refused; the running state is kept", metadata: ["file": "\(path)", "error": "\(error)"])
            outcome.refused.append((path as NSString).lastPathComponent)
        }
        if store.changedSinceKnown(store.modePath) {
            do throws(StateStore.StateError) {
                if followMode(try store.loadMode()) { outcome.applied.append("mode.json") }
            } catch {
                refuse(store.modePath, error)
            }
        }
        if store.changedSinceKnown(store.conditionsPath) {
            do throws(StateStore.StateError) {
                if try followProfile(try store.loadProfile()) { outcome.applied.append("conditions.json") }
            } catch {
                refuse(store.conditionsPath, error)
            }
        }
        if store.changedSinceKnown(store.variantsPath) {
            do throws(StateStore.StateError) {
                let files = runtime.load().snapshot.configuration.variantFiles
                if try followVariants(try store.loadVariants(files: files)) { outcome.applied.append("variants.json") }
            } catch {
                refuse(store.variantsPath, error)
            }
        }
        return outcome
    }

    /// Applies what the shared store holds for the followed file `name` (SPEC §19 `store.kind: redis`; nil: no
    /// value), parsed as strictly as the file; `origin` names it in a refusal (the Redis key). A valid value is
    /// put in force as the matching admin write would be, and written to the local file as the last state known;
    /// a bad one is refused with a log line naming the key, and the running state kept. The same value seen again
    /// is skipped, unless its write was `announced` on the channel: a `PUT /mode` that repeats the API mode in the
    /// same second writes the same bytes, and must still end the mode a schedule set on every proxy, as it does on
    /// the one written to. Returns whether it was applied, unchanged (`false`), or refused (`nil`).
    @discardableResult
    public func applyShared(_ name: String, _ bytes: [UInt8]?, origin: String, announced: Bool = false) -> Bool? {
        guard StateStore.followedFiles.contains(name), announced || sharedSeen[name] != .some(bytes) else { return false }
        sharedSeen[name] = .some(bytes)
        let given = StateStore.Given(bytes: bytes, origin: origin)
        do throws(StateStore.StateError) {
            let changed: Bool
            switch name {
            case "mode.json": changed = followMode(try store.loadMode(given))
            case "conditions.json": changed = try followProfile(try store.loadProfile(given))
            default:
                let files = runtime.load().snapshot.configuration.variantFiles
                changed = try followVariants(try store.loadVariants(files: files, given))
            }
            do {
                try store.cache(name, bytes)
            } catch {
                logger.error("cannot keep the shared state in the state directory", metadata: ["error": "\(error)"])
            }
            return changed
        } catch {
            logger.error("shared state refused; the running state is kept", metadata: ["key": "\(origin)", "error": "\(error)"])
            return nil
        }
    }

    /// Puts the file's API mode in force (none: back to the flag/config mode). A file naming the mode already in
    /// force changes nothing, so this process's own writes, seen again, are not changes.
    private func followMode(_ saved: (mode: DataMode, since: Int64)?) -> Bool {
        let current = runtime.load().snapshot
        // A mode a schedule set is no API mode: a file (or key) without one then still ends it (`DELETE /mode`).
        guard saved?.mode != current.apiMode || (saved == nil && current.modeSource == .schedule) else { return false }
        let now = self.now()
        let since = saved.map { $0.since > 0 ? $0.since : now } ?? now
        let snapshot = runtime.update { state -> RuntimeSnapshot in
            state.apply(ModeResolution(api: saved?.mode, configuration: state.configuration), now: since)
            return state
        }
        logger.info("mode changed in the state directory", metadata: ["mode": "\(snapshot.mode)", "source": "\(snapshot.modeSource.rawValue)"])
        sharedScopes.setSchedule(SharedSchedule.field(nil), nil)
        if schedules.cancel(scope: nil) { logger.info("global schedule cancelled by a mode change") }
        emitGlobalMode(snapshot)
        return true
    }

    /// Puts the file's link profile in force (none: the mode's mapping again). A profile the configuration does
    /// not define is refused.
    private func followProfile(_ name: String?) throws(StateStore.StateError) -> Bool {
        let current = runtime.load().snapshot
        if let name, current.configuration.link.profiles[name] == nil {
            throw StateStore.StateError(description: "profile \"\(name)\" is not defined in the configuration; "
                + "known: \(current.configuration.link.profileNames.joined(separator: ", "))")
        }
        guard name != current.apiProfile else { return false }
        let snapshot = runtime.update { state -> RuntimeSnapshot in
            state.apiProfile = name
            return state
        }
        logger.info("link profile changed in the state directory", metadata: ["profile": "\(name ?? "none")"])
        events.emit(.conditions, scope: "global", data: ConditionsEndpoint.document(snapshot))
        return true
    }

    /// Puts the file's API variants in force, compiled with the configuration's as a `PUT /variants/{id}` is; a set
    /// that does not compile is refused whole.
    private func followVariants(_ variants: [Variant]) throws(StateStore.StateError) -> Bool {
        let current = runtime.load().snapshot.policy
        let before = current.variants.filter { $0.source == .api }
        guard before.map(VariantJSON.text) != variants.map(VariantJSON.text) else { return false }
        let compiled: PolicySnapshot
        do {
            compiled = try current.replacingAPIVariants(variants)
        } catch {
            throw StateStore.StateError(description: "API variants do not compile: \(error)")
        }
        runtime.update { $0.policy = compiled }
        let ids = compiled.variants.map(\.id)
        logger.info("API variants changed in the state directory", metadata: ["count": "\(variants.count)"])
        events.emit(.variants, scope: "global", data: ["variants": ids, "changed": NSNull()])
        return true
    }
}
