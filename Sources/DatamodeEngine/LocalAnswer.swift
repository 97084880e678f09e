import DatamodeDeferral
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// An answer the proxy makes itself (a problem document, a redirect to a variant, a variant's file), as a value:
/// its status, its fields and its body. How it reaches the client is the session's business: an HTTP/1 session
/// writes a head and the body (`ExchangeDriver.respond`); another session kind encodes the same value its way.
struct LocalAnswer {
    enum Body {
        case bytes([UInt8])
        /// An open regular file of `size` bytes, sent with sendfile(2) (the answer owns the descriptor).
        case file(descriptor: Int32, size: Int)
    }

    var status: Int
    var reason: String
    var fields: [(String, String)]
    var body: Body

    var bodyLength: Int {
        switch body {
        case .bytes(let bytes): bytes.count
        case .file(_, let size): size
        }
    }

    /// A problem document (RFC 9457) already written (`Rejection.problemBody`, `ProblemDetail.json`), under a
    /// status line and a `Proxy-Status` that name the cause (SPEC §20).
    static func problem(_ code: ProxyErrorCode, body: [UInt8], extraFields: [(String, String)] = []) -> LocalAnswer {
        var fields: [(String, String)] = [("Content-Type", "application/problem+json"), ("Cache-Control", "no-store"),
                                          ("Proxy-Status", code.proxyStatus)]
        fields.append(contentsOf: extraFields)
        return LocalAnswer(status: code.status, reason: code.statusReason, fields: fields, body: .bytes(body))
    }

    static func problem(_ problem: ProblemDetail, extraFields: [(String, String)] = []) -> LocalAnswer {
        Self.problem(problem.code, body: Array(problem.json.utf8), extraFields: extraFields)
    }

    /// `403` for a request the data mode refuses (SPEC §4): `Network-Unavailable-Reason`, and in the problem the
    /// spent budget that caused it (SPEC §11) and when it lifts (`Retry-After`, SPEC §18.1) when known.
    /// `extra`: further problem members, JSON-encoded (`"deferral": "full"`, SPEC §18.3).
    static func rejection(_ rejection: Rejection, mode: DataMode, url: String, budget: String?,
                          lift: RefusalLift?, extra: [(String, String)] = []) -> LocalAnswer {
        var fields = [("Network-Unavailable-Reason", rejection.code.rawValue)]
        guard budget != nil || lift != nil || !extra.isEmpty else {
            // The common case, without building the document (see `Rejection.problemBody`).
            return problem(rejection.code, body: rejection.problemBody(mode: mode, url: url), extraFields: fields)
        }
        var problem = rejection.problem(mode: mode, url: url)
        if let budget { problem.extra.append(("budget", JSONText.quote(budget))) }
        if let lift {
            problem.extra.append(contentsOf: lift.problemMembers)
            fields.append(lift.retryAfterField)
        }
        problem.extra.append(contentsOf: extra)
        return Self.problem(problem, extraFields: fields)
    }

    /// `202 Accepted` for an upload stored to be delivered later (SPEC §18.3), sent only once it is committed.
    static func deferred(_ entry: DeferredEntry) -> LocalAnswer {
        let body = "{\"deferred\":\(JSONText.quote(entry.id)),\"status\":\"queued\",\"url\":\(JSONText.quote(entry.url))}"
        return LocalAnswer(status: 202, reason: "Accepted",
                           fields: [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                                    ("Data-Mode-Deferred", entry.id), ("Preference-Applied", "respond-async")],
                           body: .bytes(Array(body.utf8)))
    }

    /// `403 budget-exhausted`, naming the budget and when it resets (SPEC §11).
    /// `lift`: when it lifts (SPEC §18.1), as `Retry-After`, `retryAfter` and `liftsAt`.
    static func budgetExhausted(_ ledger: BudgetLedger, _ index: Int, url: String, lift: RefusalLift? = nil,
                                extra: [(String, String)] = []) -> LocalAnswer {
        let budget = ledger.budgets[index]
        let resetsAt = Timestamp.rfc3339(wallNanoseconds: ledger.period(index).end * 1_000_000_000, fractionDigits: 0)
        var members = [("budget", JSONText.quote(budget.name)), ("resetsAt", JSONText.quote(resetsAt)), ("url", JSONText.quote(url))]
        if let lift { members.append(contentsOf: lift.problemMembers) }
        members.append(contentsOf: extra)
        return problem(ProblemDetail(code: .budgetExhausted,
                                     detail: "The data budget \"\(budget.name)\" is spent until \(resetsAt).", extra: members),
                       extraFields: lift.map { [$0.retryAfterField] } ?? [])
    }

    /// A `redirect` variant (SPEC §5).
    static func redirect(to location: String, variant: String) -> LocalAnswer {
        LocalAnswer(status: 307, reason: "Temporary Redirect",
                    fields: [("Location", location), ("Cache-Control", "no-store"), ("Data-Mode-Variant", variant)],
                    body: .bytes([]))
    }

    /// A `file` variant (SPEC §5) for a request with `method`: the file's answer, a `405` for a method other than
    /// GET or HEAD, or nil when the file cannot be served (gone, replaced by something not a regular file, or
    /// reached through a link).
    ///
    /// The path was checked when the variant was declared (a regular file inside the variants directory), but it
    /// may have been replaced since. O_NONBLOCK: opening a FIFO would otherwise wait for a writer, stalling this
    /// worker and every connection on it. O_NOFOLLOW: a symbolic link swapped in is not followed out of the
    /// directory (the declared path is a real path, so a link there is never legitimate). Then only a regular file
    /// is served; anything else is an error response, not a hang. O_NOFOLLOW covers only the last component: a
    /// directory on the way swapped for a symbolic link would lead outside. The declared path is a real path, so
    /// the file opened must have exactly that path.
    static func variantFile(_ path: String, contentType: String, variant: String, method: String) -> LocalAnswer? {
        guard method == "GET" || method == "HEAD" else {
            return LocalAnswer(status: 405, reason: "Method Not Allowed",
                               fields: [("Allow", "GET, HEAD"), ("Cache-Control", "no-store"), ("Data-Mode-Variant", variant)],
                               body: .bytes([]))
        }
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
        var info = stat()
        guard fd >= 0, fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, openedPath(fd) == path else {
            if fd >= 0 { close(fd) }
            return nil
        }
        let fields = [("Content-Type", contentType), ("Cache-Control", "no-store"), ("Data-Mode-Variant", variant)]
        return LocalAnswer(status: 200, reason: "OK", fields: fields, body: .file(descriptor: fd, size: Int(info.st_size)))
    }

    /// The path the kernel has for an open descriptor (symbolic links resolved), from /proc/self/fd.
    static func openedPath(_ fd: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/fd/\(fd)", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
