import CLibevent
import DatamodeDeferral
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// A refused upload accepted instead (SPEC §18.3): its body is read whole (at most `deferral.max-body`), the
/// upload is handed to the `DeferredStore`, and only once the store has committed it durably is the client
/// answered `202 Accepted`. The worker's loop never waits for the disk: the store works on its own thread and its
/// answer comes back through the worker's wake pipe (`Worker.deferralStored`).
///
/// Failing to store it (the queue or the disk full, the store broken) answers the refusal the request would have
/// had, with `"deferral": "full"` when the queue or the disk is full; a body over `max-body` gets that refusal too,
/// the rest of its body thrown away as after any refusal.
final class DeferralIntake {
    /// What the intake waits for.
    enum Phase {
        /// The body, from the client.
        case readingBody
        /// The store's commit.
        case committing
    }

    unowned let driver: ExchangeDriver
    let head: RequestHead
    /// The refusal it would have had, carried out when it cannot be stored.
    let refusal: Admission.Verdict
    let maxBody: Int
    private(set) var phase = Phase.readingBody
    private var body: [UInt8] = []
    private let scratch: OpaquePointer

    /// Whether a refused request is to be stored (SPEC §18.3): a `POST`, `PUT` or `PATCH` with
    /// `Prefer: respond-async` or a URL in `deferral.uploads`, while the proxy has a store; `http://` and, inside
    /// interception, `https://` (delivered over TLS, `DeliveryClient`).
    static func wants(_ head: RequestHead, url: String?, worker: Worker) -> Bool {
        guard worker.deferredStore != nil, let url, url.hasPrefix("http://") || url.hasPrefix("https://") else { return false }
        switch head.method {
        case "POST", "PUT", "PATCH": break
        default: return false
        }
        if head.contains("prefer"), Preferences.parse(head.values(of: "prefer")).respondAsync { return true }
        return worker.settings.deferral.storesUpload(url: url)
    }

    /// Starts reading `driver`'s body to store it; false when it is known to be too large already (its
    /// `Content-Length` is over `max-body`), and the refusal is answered as usual.
    static func start(_ driver: ExchangeDriver, _ head: RequestHead, refusal: Admission.Verdict) -> Bool {
        let maxBody = driver.worker.settings.deferral.maxBody
        if case .contentLength(let length) = driver.requestFraming, length > UInt64(maxBody) { return false }
        let intake = DeferralIntake(driver: driver, head: head, refusal: refusal, maxBody: maxBody)
        // What is stored is the payload: a chunked body's framing belongs to the client's hop, and `max-body`
        // counts the payload (the delivery sends it with its own `Content-Length`).
        driver.requestBody.stripChunkFraming()
        driver.intake = intake
        driver.session.machine.store(driver)
        if driver.expectsContinue && !driver.requestBody.isComplete {
            // RFC 9110 §10.1.1: the client waits for this before it sends the body the proxy now wants.
            let interim = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)
            evbuffer_add(driver.output, interim, interim.count)
        }
        intake.readable()
        return true
    }

    init(driver: ExchangeDriver, head: RequestHead, refusal: Admission.Verdict, maxBody: Int) {
        self.driver = driver
        self.head = head
        self.refusal = refusal
        self.maxBody = maxBody
        scratch = evbuffer_new()
        if case .contentLength(let length) = driver.requestFraming { body.reserveCapacity(Int(length)) }
    }

    deinit { evbuffer_free(scratch) }

    /// Body bytes arrived (or the body is already whole).
    func readable() {
        guard case .readingBody = phase else { return }
        let outcome = driver.requestBody.pump(from: driver.input, to: scratch, budget: Int.max)
        let moved = evbuffer_get_length(scratch)
        if moved > 0 {
            if body.count + moved > maxBody {
                refuse(full: false)
                return
            }
            // One contiguous copy of what was read, appended with memcpy.
            if let bytes = evbuffer_pullup(scratch, moved) {
                body.append(contentsOf: UnsafeBufferPointer(start: bytes, count: moved))
            }
            evbuffer_drain(scratch, moved)
        }
        switch outcome {
        case .complete:
            commit()
        case .invalid:
            // Broken chunked framing: refused and closed, as any body the proxy cannot delimit.
            driver.machine.closeAfter()
            driver.respondError(.badRequest, detail: "invalid request body framing", close: true)
        case .inProgress:
            if driver.session.machine.clientEnded {
                driver.session.abort(.clientAborted, detail: "client ended before its upload's body")
            }
        }
    }

    /// The client half-closed. Before the whole body that is the end of the upload; after it, the commit goes on
    /// (the upload is stored and delivered; the client will not see its `202`).
    func clientEnded() {
        switch phase {
        case .readingBody: readable()
        case .committing: driver.machine.closeAfter()
        }
    }

    private func commit() {
        phase = .committing
        let exchange = driver.exchange
        let upload = DeferredUpload(method: head.method, url: exchange.url, headers: Self.storedFields(head),
                                    body: body, session: exchange.session?.id)
        body = []
        let worker = driver.worker
        let token = DeferralToken(driver: driver, worker: worker)
        worker.deferredStore?.enqueue(upload, now: worker.clock.wallNanoseconds() / 1_000_000) { result in
            token.worker.deferralStored(DeferralResult(token: token, result: result))
        }
    }

    /// The store answered (on the worker's loop).
    func stored(_ result: Result<DeferredEntry, DeferredStoreError>) {
        guard case .committing = phase else { return }
        switch result {
        case .success(let entry):
            driver.worker.deferralCounters.count(.queued)
            driver.worker.deferralEvents?(entry, "queued")
            let exchange = driver.exchange
            exchange.outcome = .rejected
            exchange.reason = Self.code(of: refusal).rawValue
            driver.respond(.deferred(entry), close: false)
        case .failure(let error):
            driver.worker.logger.info("upload not deferred", metadata: ["url": "\(driver.exchange.url)", "error": "\(error)"])
            refuse(full: error.isFull)
        }
        driver.session.flushPendingWrites()
    }

    /// The refusal it would have had; `full`: with `"deferral": "full"` (SPEC §18.3).
    private func refuse(full: Bool) {
        phase = .committing
        driver.intake = nil
        if full { driver.worker.deferralCounters.count(.refusedFull) }
        let extra = full ? [("deferral", "\"full\"")] : []
        let exchange = driver.exchange
        exchange.outcome = .rejected
        switch refusal {
        case .reject(let rejection, let budget):
            exchange.reason = rejection.code.rawValue
            driver.respond(.rejection(rejection, mode: exchange.mode, url: exchange.url, budget: budget,
                                      lift: driver.refusalLift, extra: extra), close: false)
        case .budgetExhausted(let index):
            exchange.reason = ProxyErrorCode.budgetExhausted.rawValue
            driver.respond(.budgetExhausted(driver.worker.budgets, index, url: exchange.url, lift: driver.refusalLift,
                                            extra: extra), close: false)
        default:
            preconditionFailure("a deferral intake for a request that is not refused by the data mode")
        }
    }

    /// The error code of the refusal an upload was stored in place of (the access log's and metrics' reason).
    static func code(of refusal: Admission.Verdict) -> ProxyErrorCode {
        switch refusal {
        case .reject(let rejection, _): rejection.code
        default: .budgetExhausted
        }
    }

    /// What is stored of the request's fields (SPEC §18.3): not its credentials for the proxy
    /// (`Proxy-Authorization`), not what belongs to its hop (`Connection` and what it lists, `Keep-Alive`, `TE`,
    /// `Trailer`, `Upgrade`, `Proxy-Connection`), not its framing (the delivery sends the body whole with its
    /// own `Content-Length`), `Host` (written from the URL), `Expect`, and not what was for the proxy
    /// (`Prefer`, `Data-Mode-Session`: the session is stored on its own). Its `Allow-*` tags are kept: the upload
    /// is judged by them again when it is due, and the delivery writes the tags resolved then.
    static func storedFields(_ head: RequestHead) -> [HTTPField] {
        let listed = head.connectionTokens
        return head.fields.filter { field in
            let known = KnownField.of(field.name)
            switch known {
            case .allowConstrained, .allowExpensive, .allowUltraConstrained: return true
            case .contentLength, .transferEncoding: return false
            default: if known.isRequestHopByHop { return false }
            }
            if listed.contains(field.name) { return false }
            let lowered = field.name.lowercased()
            return lowered != "prefer" && lowered != "expect"
        }
    }
}

/// Identifies the exchange a store operation belongs to; read only on its worker's thread. Weak: a connection
/// that closed meanwhile is simply gone when the answer comes (the upload is stored all the same).
///
/// `@unchecked Sendable`: the store thread only carries it back to `worker` (whose `deferralStored` is thread-safe);
/// `driver` is read on the worker's thread alone. Strong on the worker: a worker stopped meanwhile stays allocated
/// (its pipe open) until the answer is back.
final class DeferralToken: @unchecked Sendable {
    weak var driver: ExchangeDriver?
    let worker: Worker

    init(driver: ExchangeDriver, worker: Worker) {
        self.driver = driver
        self.worker = worker
    }
}

struct DeferralResult: @unchecked Sendable {
    var token: DeferralToken
    var result: Result<DeferredEntry, DeferredStoreError>
}

