import CLibevent
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// Answers the proxy makes itself (`LocalAnswer`: problems, redirects, file variants), and the draining of the
/// request body they leave unread.
extension ExchangeDriver {
    /// A `file` variant (SPEC §5): its file, `405` for another method than GET or HEAD, or `502` when the file
    /// cannot be served any more.
    func serveFile(_ head: RequestHead, path: String, contentType: String, variant: String) {
        guard let answer = LocalAnswer.variantFile(path, contentType: contentType, variant: variant, method: head.method) else {
            respondError(.upstreamUnreachable, detail: "variant \(variant): file \(path) cannot be read", close: false)
            return
        }
        respond(answer, close: false)
    }

    /// An error of the proxy's own (SPEC §6): a problem document, the exchange recorded as an error unless it was
    /// already refused.
    func respondError(_ code: ProxyErrorCode, detail: String?, close: Bool, extraFields: [(String, String)] = []) {
        if exchange.outcome == .forwarded || exchange.outcome == nil || exchange.outcome == .rewritten {
            exchange.outcome = .error
            exchange.reason = code.rawValue
        }
        respond(.problem(ProblemDetail(code: code, detail: detail), extraFields: extraFields), close: close)
    }

    /// `403 budget-exhausted`, naming the budget and when it resets (SPEC §11).
    func refuseForBudget(_ index: Int, url: String) {
        exchange.outcome = .rejected
        exchange.reason = ProxyErrorCode.budgetExhausted.rawValue
        respond(.budgetExhausted(worker.budgets, index, url: url, lift: refusalLift), close: false)
    }

    /// Writes a complete answer made by the proxy. The request's body (if any) is read and discarded so the
    /// connection stays usable; `close` ends the connection after it instead (framing we cannot trust).
    func respond(_ answer: LocalAnswer, close: Bool) {
        // A refused CONNECT always closes: the client may already have sent tunnel bytes behind it
        // (RFC 9110 §9.3.6), which must never be read as the next HTTP request (request smuggling).
        if close || exchange.method == "CONNECT" { machine.closeAfter() }
        // RFC 9110 §10.1.1: a client that sent `Expect: 100-continue` waits for a 100 that will not come now; it
        // will not send the body, so waiting to discard it would hang both sides. Close after the answer.
        if expectsContinue && !requestBody.isComplete { machine.closeAfter() }
        heldLease?.close()
        var fields = answer.fields
        if let held = exchange.heldMilliseconds { fields.append(("Data-Mode-Held", String(held))) }
        let head = MessageHeads.local(status: answer.status, reason: answer.reason, fields: fields,
                                      bodyLength: answer.bodyLength, keepAlive: machine.keepAlive,
                                      clientVersion: exchange.clientVersion)
        evbuffer_add(output, head, head.count)
        exchange.status = answer.status
        switch answer.body {
        case .bytes(let body):
            if exchange.method != "HEAD" && !body.isEmpty { evbuffer_add(output, body, body.count) }
            exchange.bytesOut = UInt64(body.count)
        case .file(let descriptor, let size):
            if exchange.method == "HEAD" || size == 0 {
                Glibc.close(descriptor)
            } else {
                // sendfile(2) when the output goes to a socket: the file's bytes never enter user space.
                evbuffer_add_file(output, descriptor, 0, Int64(size))  // takes ownership of the descriptor
                if exchange.method == "GET", let saving = worker.knownLengths.saving(exchange.url, replacement: UInt64(size)) {
                    worker.metrics.saved(.variant, bytes: saving)
                }
                transport.queuedFile()
                exchange.bytesOut = UInt64(size)
            }
        }
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
        session.machine.drainRefusedBody(self)
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
            if session.machine.clientEnded {
                machine.closeAfter()
                finishExchange(recycleUpstream: false)
            }
        }
    }
}
