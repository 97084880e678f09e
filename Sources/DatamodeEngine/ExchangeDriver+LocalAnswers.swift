import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// Answers the proxy makes itself (problems, redirects, file variants) and the draining of a refused body.
extension ExchangeDriver {
    // MARK: local responses

    func serveFile(_ head: RequestHead, path: String, contentType: String, variant: String) {
        guard head.method == "GET" || head.method == "HEAD" else {
            respondLocal(status: 405, reason: "Method Not Allowed",
                         fields: [("Allow", "GET, HEAD"), ("Cache-Control", "no-store"), ("Data-Mode-Variant", variant)],
                         body: [], close: false)
            return
        }
        // The path was checked when the variant was declared (a regular file inside the variants directory), but
        // it may have been replaced since. O_NONBLOCK: opening a FIFO would otherwise wait for a writer, stalling
        // this worker and every connection on it. O_NOFOLLOW: a symbolic link swapped in is not followed out of
        // the directory (the declared path is a real path, so a link there is never legitimate). Then only a
        // regular file is served; anything else is an error response, not a hang.
        // O_NOFOLLOW covers only the last component: a directory on the way swapped for a symbolic link would
        // lead outside. The declared path is a real path, so the file opened must have exactly that path.
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
        var info = stat()
        guard fd >= 0, fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, Self.openedPath(fd) == path else {
            if fd >= 0 { Glibc.close(fd) }
            respondError(.upstreamUnreachable, detail: "variant \(variant): file \(path) cannot be read", close: false)
            return
        }
        if expectsContinue && !requestBody.isComplete { machine.closeAfter() }
        let size = Int(info.st_size)
        let headBytes = MessageHeads.local(status: 200, reason: "OK",
                                           fields: [("Content-Type", contentType), ("Cache-Control", "no-store"),
                                                    ("Data-Mode-Variant", variant)],
                                           bodyLength: size, keepAlive: machine.keepAlive,
                                           clientVersion: head.version)
        evbuffer_add(output, headBytes, headBytes.count)
        exchange.status = 200
        if head.method == "HEAD" || size == 0 {
            Glibc.close(fd)
        } else {
            // sendfile(2) when the output goes to a socket: the file's bytes never enter user space.
            evbuffer_add_file(output, fd, 0, Int64(size))  // takes ownership of fd
            if head.method == "GET", let saving = worker.knownLengths.saving(exchange.url, replacement: UInt64(size)) {
                worker.metrics.saved(.variant, bytes: saving)
            }
            transport.queuedFile()
            exchange.bytesOut = UInt64(size)
        }
        finishLocalResponse()
    }

    /// The path the kernel has for an open descriptor (symbolic links resolved), from /proc/self/fd.
    static func openedPath(_ fd: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/fd/\(fd)", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func respondError(_ code: ProxyErrorCode, detail: String?, close: Bool,
                              extraFields: [(String, String)] = []) {
        if exchange.outcome == .forwarded || exchange.outcome == nil || exchange.outcome == .rewritten {
            exchange.outcome = .error
            exchange.reason = code.rawValue
        }
        respondProblem(ProblemDetail(code: code, detail: detail), close: close, extraFields: extraFields)
    }

    func respondProblem(_ problem: ProblemDetail, close: Bool,
                                extraFields: [(String, String)] = []) {
        respondProblem(problem.code, body: Array(problem.json.utf8), close: close, extraFields: extraFields)
    }

    /// A problem document already written (`Rejection.problemBody`).
    func respondProblem(_ code: ProxyErrorCode, body: [UInt8], close: Bool,
                        extraFields: [(String, String)] = []) {
        var fields: [(String, String)] = [
            ("Content-Type", "application/problem+json"),
            ("Cache-Control", "no-store"),
        ]
        fields.append(contentsOf: extraFields)
        respondLocal(status: code.status, reason: code.reasonPhrase, fields: fields, body: body, close: close)
    }

    /// Writes a complete response made by the proxy. The request's body (if any) is read and discarded so the
    /// connection stays usable; `close` ends the connection after it instead (framing we cannot trust).
    func respondLocal(status: Int, reason: String, fields: [(String, String)],
                              body: [UInt8], close: Bool) {
        // A refused CONNECT always closes: the client may already have sent tunnel bytes behind it
        // (RFC 9110 §9.3.6), which must never be read as the next HTTP request (request smuggling).
        if close || exchange.method == "CONNECT" { machine.closeAfter() }
        // RFC 9110 §10.1.1: a client that sent `Expect: 100-continue` waits for a 100 that will not come now; it
        // will not send the body, so waiting to discard it would hang both sides. Close after the answer.
        if expectsContinue && !requestBody.isComplete { machine.closeAfter() }
        if let upstream = upstream {
            upstream.close()
            self.upstream = nil
        }
        let head = MessageHeads.local(status: status, reason: reason, fields: fields, bodyLength: body.count,
                                      keepAlive: machine.keepAlive, clientVersion: exchange.clientVersion)
        evbuffer_add(output, head, head.count)
        if exchange.method != "HEAD" && !body.isEmpty { evbuffer_add(output, body, body.count) }
        exchange.status = status
        exchange.bytesOut = UInt64(body.count)
        finishLocalResponse()
    }

    /// After a local response: discard the request body (draining it is a state of its own), then go on with the
    /// next request.
    func finishLocalResponse() {
        machine.end()
        guard machine.keepAlive else {
            finishExchange(recycleUpstream: false)
            return
        }
        client.machine.drainRefusedBody(self)
        discardRequestBody()
    }

    func discardRequestBody() {
        switch requestBody.pump(from: input, to: nil, budget: Int.max) {
        case .complete:
            finishExchange(recycleUpstream: false)
        case .invalid:
            machine.closeAfter()
            finishExchange(recycleUpstream: false)
        case .inProgress:
            // The client ended mid-body: the local response already queued is still written, then we close.
            if client.machine.clientEnded {
                machine.closeAfter()
                finishExchange(recycleUpstream: false)
            }
        }
    }

    /// `403 budget-exhausted`, naming the budget and when it resets.
    func refuseForBudget(_ index: Int, url: String) {
        let ledger = worker.budgets
        let budget = ledger.budgets[index]
        let resetsAt = Timestamp.rfc3339(wallNanoseconds: ledger.period(index).end * 1_000_000_000, fractionDigits: 0)
        exchange.outcome = .rejected
        exchange.reason = ProxyErrorCode.budgetExhausted.rawValue
        let problem = ProblemDetail(code: .budgetExhausted,
                                    detail: "The data budget \"\(budget.name)\" is spent until \(resetsAt).",
                                    extra: [("budget", JSONText.quote(budget.name)), ("resetsAt", JSONText.quote(resetsAt)),
                                            ("url", JSONText.quote(url))])
        respondProblem(problem, close: false)
    }
}
