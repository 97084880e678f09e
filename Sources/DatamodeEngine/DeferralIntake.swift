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
/// answers come back through the worker's wake pipe (`Worker.deferralStored`).
///
/// The body is never held whole (SPEC §6): up to the store's `inlineBody` it is kept here and stored with its
/// entry; past that it goes to its body file piece by piece as it arrives (`DeferredStore.appendBody`), at most
/// `window` bytes on their way to the store at once. Beyond that the intake stops taking bytes from the client's
/// input, which fills to its watermark and stops reading the client (`ReadHold`): backpressure, as for any body
/// relayed to a slow origin. Each write the store finishes makes room again. The commit
/// (`enqueue(_:staged:now:completion:)`) fsyncs the file and its name before the entry, then the `202`.
///
/// Failing to store it (the queue or the disk full, the store broken) answers the refusal the request would have
/// had, with `"deferral": "full"` when the queue or the disk is full; a body over `max-body` gets that refusal too,
/// the rest of its body thrown away as after any refusal, and what was written of it removed.
final class DeferralIntake {
    /// What the intake waits for.
    enum Phase {
        /// The body, from the client.
        case readingBody
        /// The store's commit.
        case committing
    }

    /// Body bytes on their way to the store at most, per upload: past this the client is not read.
    static let window = 256 << 10

    unowned let driver: ExchangeDriver
    let head: RequestHead
    /// The refusal it would have had, carried out when it cannot be stored.
    let refusal: Admission.Verdict
    let maxBody: Int
    let store: DeferredStore
    private(set) var phase = Phase.readingBody
    /// The body while it is small enough to be stored with its entry (`inlineBody`); empty once staged.
    private var body: [UInt8] = []
    /// The body's file, once the body outgrew `body`.
    private var staged: StagedBody?
    /// Payload bytes taken from the client.
    private var received = 0
    /// Bytes handed to the store and not yet written.
    private var unwritten = 0
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
        guard let store = driver.worker.deferredStore else { return false }
        let intake = DeferralIntake(driver: driver, head: head, refusal: refusal, maxBody: maxBody, store: store)
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

    init(driver: ExchangeDriver, head: RequestHead, refusal: Admission.Verdict, maxBody: Int, store: DeferredStore) {
        self.driver = driver
        self.head = head
        self.refusal = refusal
        self.maxBody = maxBody
        self.store = store
        scratch = evbuffer_new()
    }

    deinit {
        evbuffer_free(scratch)
        // Refused, or the client went away: what was written of the body goes (a committed one stays, the store
        // knows which).
        if let staged { store.discardBody(staged) }
    }

    /// Body bytes arrived (or the body is already whole), or the store made room for more.
    func readable() {
        guard case .readingBody = phase else { return }
        let room = staged == nil ? Int.max : Self.window - unwritten
        // No room: the bytes stay in the client's input, which stops reading the client at its watermark.
        let outcome = room > 0 ? driver.requestBody.pump(from: driver.input, to: scratch, budget: room) : .inProgress
        let moved = evbuffer_get_length(scratch)
        if moved > 0 {
            if received + moved > maxBody {
                refuse(full: false)
                return
            }
            received += moved
            // One contiguous copy of what was read, appended with memcpy.
            if let bytes = evbuffer_pullup(scratch, moved) {
                body.append(contentsOf: UnsafeBufferPointer(start: bytes, count: moved))
            }
            evbuffer_drain(scratch, moved)
            if staged != nil || body.count > store.limits.inlineBody { write() }
        }
        switch outcome {
        case .complete:
            commit()
        case .invalid:
            // Broken chunked framing: refused and closed, as any body the proxy cannot delimit.
            driver.machine.closeAfter()
            driver.respondError(.badRequest, detail: "invalid request body framing", close: true)
        case .inProgress:
            // Held back for room, the rest of the body may still be in the input after the client's end.
            let waiting = unwritten >= Self.window && evbuffer_get_length(driver.input) > 0
            if driver.session.machine.clientEnded && !waiting {
                driver.session.abort(.clientAborted, detail: "client ended before its upload's body")
            }
        }
    }

    /// Hands what `body` holds to the store, to be appended to the body file (created with the first piece).
    private func write() {
        let staged = staged ?? store.stageBody()
        self.staged = staged
        let piece = body
        body = []
        unwritten += piece.count
        let token = DeferralToken(self)
        store.appendBody(staged, piece) { result in
            token.worker.deferralStored(DeferralResult(token: token, result: .written(piece.count, result.map { _ in () })))
        }
    }

    /// The store wrote a piece (on the worker's loop): room for more of the body, or the refusal when it cannot
    /// be stored (over `max-body` or `max-bytes`, the disk full).
    func written(_ count: Int, _ result: Result<Void, DeferredStoreError>) {
        unwritten -= count
        guard case .readingBody = phase else { return }  // committing: the commit reports any failure
        switch result {
        case .success:
            driver.session.transport.readMoreIfPending()
            readable()
        case .failure(let error):
            driver.worker.logger.info("upload not deferred", metadata: ["url": "\(driver.exchange.url)", "error": "\(error)"])
            refuse(full: error.isFull)
        }
        driver.session.flushPendingWrites()
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
        if staged != nil && !body.isEmpty { write() }
        let upload = DeferredUpload(method: head.method, url: exchange.url, headers: Self.storedFields(head),
                                    body: body, session: exchange.session?.id)
        body = []
        let worker = driver.worker
        let token = DeferralToken(self)
        let now = worker.clock.wallNanoseconds() / 1_000_000
        let completion: @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void = { result in
            token.worker.deferralStored(DeferralResult(token: token, result: .stored(result)))
        }
        if let staged {
            store.enqueue(upload, staged: staged, now: now, completion: completion)
        } else {
            store.enqueue(upload, now: now, completion: completion)
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
    /// The intake that asked: an answer for an intake the driver no longer has (refused meanwhile) is dropped.
    weak var intake: DeferralIntake?
    let worker: Worker

    init(_ intake: DeferralIntake) {
        driver = intake.driver
        self.intake = intake
        worker = intake.driver.worker
    }
}

struct DeferralResult: @unchecked Sendable {
    /// What the store did.
    enum Answer {
        /// A piece of the body (this many bytes) was written to its file, or could not be.
        case written(Int, Result<Void, DeferredStoreError>)
        /// The upload was committed, or could not be.
        case stored(Result<DeferredEntry, DeferredStoreError>)
    }

    var token: DeferralToken
    var result: Answer
}

