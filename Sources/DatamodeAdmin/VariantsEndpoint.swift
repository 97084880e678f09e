import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// `GET /variants`, `PUT /variants/{id}`, `DELETE /variants/{id}` (SPEC §5, §7).
///
/// API variants are validated by compiling the whole policy with them (the same checks as config variants),
/// persisted, and only then published to the workers. Config variants are read-only here (409).
struct VariantsEndpoint {
    let api: AdminAPI

    func handleCollection(_ request: AdminRequest) -> AdminResponse {
        let variants = api.runtime.load().snapshot.policy.variants
        return AdminJSON.ok(variants.map(VariantJSON.document))
    }

    /// `pathSegment`: the `{id}` of the path as received, percent-encoded (`id(fromPathSegment:)`).
    func handleItem(_ request: AdminRequest, pathSegment: String) -> AdminResponse {
        guard let id = Self.id(fromPathSegment: pathSegment) else {
            let quoted = AdminPathSegment.quoted(pathSegment)
            switch request.method {
            case "PUT":
                return AdminProblem.response(ProxyErrorCode.invalidVariant.status, ProxyErrorCode.invalidVariant.rawValue,
                                             "variant id \(quoted) may contain only letters, digits, '.', '_' and '-' "
                                                 + "(percent-decoded)")
            case "GET", "HEAD", "DELETE":
                return AdminProblem.response(404, "not-found", "no variant \(quoted)")
            default:
                return AdminAPI.methodNotAllowed(request)
            }
        }
        let variants = api.runtime.load().snapshot.policy.variants
        let existing = variants.first { $0.id == id }
        switch request.method {
        case "GET", "HEAD":
            guard let existing else { return AdminProblem.response(404, "not-found", "no variant \"\(id)\"") }
            return AdminJSON.ok(VariantJSON.document(existing))
        case "PUT":
            if existing?.source == .config {
                return AdminProblem.response(409, "conflict", "variant \"\(id)\" is defined in the configuration file and is read-only here")
            }
            let variant: Variant
            switch VariantJSON.parse(request.body, id: id, files: api.runtime.load().snapshot.configuration.variantFiles) {
            case .success(let parsed): variant = parsed
            case .failure(let failure): return failure.response
            }
            var apiVariants = variants.filter { $0.source == .api }
            if let index = apiVariants.firstIndex(where: { $0.id == id }) {
                apiVariants[index] = variant
            } else {
                apiVariants.append(variant)
            }
            return publish(apiVariants, status: existing == nil ? 201 : 200, document: VariantJSON.document(variant))
        case "DELETE":
            guard let existing else { return AdminProblem.response(404, "not-found", "no variant \"\(id)\"") }
            guard existing.source == .api else {
                return AdminProblem.response(409, "conflict", "variant \"\(id)\" is defined in the configuration file and is read-only here")
            }
            let apiVariants = variants.filter { $0.source == .api && $0.id != id }
            return publish(apiVariants, status: 200, document: ["deleted": id])
        default:
            return AdminAPI.methodNotAllowed(request)
        }
    }

    /// The variant id `segment` names: percent-decoded (RFC 3986 §2.1), and nil unless every byte it decodes to is one
    /// of an id's (`Variant.isIDCharacter`, SPEC §5). Decoding to a String first made a byte that is not UTF-8 an
    /// empty id (`caf%E9` was refused as "id must not be empty") and put the decoded text, whatever it was, in the
    /// refusal.
    static func id(fromPathSegment segment: String) -> String? {
        guard let decoded = segment.removingPercentEncoding, !decoded.isEmpty,
              decoded.utf8.allSatisfy(Variant.isIDCharacter) else { return nil }
        return decoded
    }

    /// Compiles, persists, then publishes. A variant that does not compile changes nothing.
    private func publish(_ apiVariants: [Variant], status: Int, document: [String: Any]) -> AdminResponse {
        let current = api.runtime.load().snapshot.policy
        let compiled: PolicySnapshot
        do {
            compiled = try current.replacingAPIVariants(apiVariants)
        } catch {
            return AdminProblem.response(ProxyErrorCode.invalidVariant.status, ProxyErrorCode.invalidVariant.rawValue, "\(error)")
        }
        do {
            try api.store.saveVariants(apiVariants)
        } catch {
            return api.stateWriteFailure(error)
        }
        // Publish what was compiled, unless a reload replaced the policy meanwhile: then compile against that
        // (under the lock, but only in that rare case).
        api.runtime.update { state in
            if state.policy.variants.count == current.variants.count
                && state.policy.variants.elementsEqual(current.variants, by: { $0.id == $1.id && $0.source == $1.source }) {
                state.policy = compiled
            } else {
                state.policy = (try? state.policy.replacingAPIVariants(apiVariants)) ?? compiled
            }
        }
        let ids = api.runtime.load().snapshot.policy.variants.map(\.id)
        api.events.emit(.variants, scope: "global", data: ["variants": ids, "changed": document["id"] ?? document["deleted"] ?? NSNull()])
        return AdminJSON.ok(document, status: status)
    }
}

/// Variants as JSON: the fields of SPEC §5 plus `source`.
enum VariantJSON {
    static func document(_ variant: Variant) -> [String: Any] {
        var out: [String: Any] = ["id": variant.id, "match": variant.match, "when": variant.when.rawValue,
                                  "source": variant.source.rawValue]
        switch variant.resource {
        case .target(let target, let redirect):
            out["target"] = target
            out["action"] = redirect ? "redirect" : "forward"
        case .file(let path, let contentType):
            out["file"] = path
            if let contentType { out["content-type"] = contentType }
        }
        return out
    }

    /// One variant as a JSON object on one line, without Foundation (fast for 10,000 variants).
    static func text(_ variant: Variant) -> String {
        var out = "{\"id\":\(JSONText.quote(variant.id)),\"match\":\(JSONText.quote(variant.match))"
        switch variant.resource {
        case .target(let target, let redirect):
            out += ",\"target\":\(JSONText.quote(target)),\"action\":\"\(redirect ? "redirect" : "forward")\""
        case .file(let path, let contentType):
            out += ",\"file\":\(JSONText.quote(path))"
            if let contentType { out += ",\"content-type\":\(JSONText.quote(contentType))" }
        }
        return out + ",\"when\":\"\(variant.when.rawValue)\",\"source\":\"\(variant.source.rawValue)\"}"
    }

    static let keys: Set<String> = ["id", "match", "target", "file", "content-type", "when", "action", "source"]

    /// A variant from a PUT body; `id` comes from the path (a body `id` must agree). A `file` is resolved and
    /// confined by `files` exactly as a config variant's (SPEC §5): relative to the config file's directory (the
    /// working directory without one), and only a regular file inside the variants directory.
    static func parse(_ body: [UInt8], id: String, files: VariantFiles) -> Result<Variant, AdminFailure> {
        let object: [String: Any]
        switch AdminJSON.object(body) {
        case .success(let o): object = o
        case .failure(let f): return .failure(f)
        }
        if let key = Set(object.keys).subtracting(keys).sorted().first {
            return .failure(AdminFailure(400, "bad-request", "unknown key \"\(key)\"; allowed: \(keys.sorted().joined(separator: ", "))"))
        }
        func string(_ key: String) -> Result<String?, AdminFailure> {
            guard let value = object[key] else { return .success(nil) }
            guard let text = value as? String else {
                return .failure(AdminFailure(400, "bad-request", "\"\(key)\" must be a non-empty string"))
            }
            // An empty `file` names no file: refused as such (`invalid-variant`, SPEC §5) by the variants-dir check.
            guard !text.isEmpty || key == "file" else {
                return .failure(AdminFailure(400, "bad-request", "\"\(key)\" must be a non-empty string"))
            }
            return .success(text)
        }
        do {
            if let bodyID = try string("id").get(), bodyID != id {
                return .failure(AdminFailure(400, "bad-request", "the body's id \"\(bodyID)\" differs from the path's \"\(id)\""))
            }
            if let source = try string("source").get(), source != "api" {
                return .failure(AdminFailure(400, "bad-request", "\"source\" can only be \"api\" here"))
            }
            guard let match = try string("match").get() else {
                return .failure(AdminFailure(400, "bad-request", "\"match\" (an absolute URL pattern) is required"))
            }
            let when: VariantCondition
            if let text = try string("when").get() {
                guard let parsed = VariantCondition(rawValue: text) else {
                    return .failure(AdminFailure(400, "bad-request", "\"when\" must be one of \(VariantCondition.allCases.map(\.rawValue).joined(separator: ", "))"))
                }
                when = parsed
            } else {
                when = .disallowed
            }
            let target = try string("target").get()
            let file = try string("file").get()
            let contentType = try string("content-type").get()
            let action = try string("action").get()
            let resource: VariantResource
            switch (target, file) {
            case (let target?, nil):
                guard contentType == nil else {
                    return .failure(AdminFailure(400, "bad-request", "\"content-type\" applies to file variants only"))
                }
                guard action == nil || action == "forward" || action == "redirect" else {
                    return .failure(AdminFailure(400, "bad-request", "\"action\" must be forward or redirect"))
                }
                resource = .target(target, redirect: action == "redirect")
            case (nil, let file?):
                guard action == nil else {
                    return .failure(AdminFailure(400, "bad-request", "\"action\" applies to target variants only"))
                }
                switch files.resolve(file) {
                case .success(let path):
                    resource = .file(path: path, contentType: contentType)
                case .failure(let problem):
                    let code = ProxyErrorCode.invalidVariant
                    return .failure(AdminFailure(code.status, code.rawValue, "\(problem)"))
                }
            default:
                return .failure(AdminFailure(400, "bad-request", "give exactly one of \"target\" (a URL) or \"file\" (a local path)"))
            }
            return .success(Variant(id: id, match: match, resource: resource, when: when, source: .api))
        } catch {
            return .failure(error)
        }
    }
}
