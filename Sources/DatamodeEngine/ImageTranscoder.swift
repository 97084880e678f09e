import CDatamodeImage
import CDatamodeShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What an image is, read from its header only (SPEC §13: the size is known before anything is decoded).
struct ImageProbe: Sendable, Equatable {
    enum Format: Int32, Sendable {
        case jpeg = 1, png = 2, webp = 3

        var mediaType: String {
            switch self {
            case .jpeg: "image/jpeg"
            case .png: "image/png"
            case .webp: "image/webp"
            }
        }

        init?(mediaType: String) {
            switch mediaType {
            case "image/jpeg", "image/jpg", "image/pjpeg": self = .jpeg
            case "image/png": self = .png
            case "image/webp": self = .webp
            default: return nil
            }
        }
    }

    var format: Format
    var width: Int
    var height: Int
    var animated: Bool

    /// `nil` when the bytes are not a JPEG, PNG or WebP whose dimensions could be read.
    init?(_ bytes: [UInt8]) {
        var info = dm_image_info()
        let found = bytes.withUnsafeBufferPointer { dm_image_probe($0.baseAddress, $0.count, &info) }
        guard found == 0, let format = Format(rawValue: info.format) else { return nil }
        self.format = format
        width = Int(info.width)
        height = Int(info.height)
        animated = info.animated != 0
    }
}

/// One transcoding job and where its result goes back to.
struct ImageJob: @unchecked Sendable {
    var input: [UInt8]
    var probe: ImageProbe
    var maxWidth: Int
    var quality: Int
    var output: ImageProbe.Format
    /// The worker whose loop gets the result (through its wake pipe), and the connection/exchange, which only
    /// that worker's thread touches. `@unchecked Sendable` for these two references: the pool threads only carry
    /// them back. Strong: a worker stopped while a job runs stays allocated (its pipe open) until the job is back.
    var worker: Worker
    var token: ImageJobToken
}

/// Identifies the exchange a job belongs to; read only on the worker's thread. Weak: a connection that closed
/// while its image was transcoding is simply gone when the result arrives.
final class ImageJobToken: @unchecked Sendable {
    weak var connection: ClientConnection?
    weak var exchange: Exchange?

    init(connection: ClientConnection, exchange: Exchange) {
        self.connection = connection
        self.exchange = exchange
    }
}

struct ImageResult: @unchecked Sendable {
    var token: ImageJobToken
    /// The encoded image, or nil when transcoding failed.
    var output: [UInt8]?
}

/// A bounded pool of threads that decode, resize and encode images off the event loops (SPEC §13). Jobs wait in
/// a bounded queue; when it is full, `submit` refuses and the image passes untouched. One pool per process,
/// started on first use, with one thread per core (at least one): transcoding is CPU-bound, and the event loops
/// keep running beside it (the kernel schedules them; they spend most of their time waiting).
final class ImageTranscoder: @unchecked Sendable {
    static let shared = ImageTranscoder(threads: max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))), queueLimit: 64)

    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var queue: [ImageJob] = []
    private var head = 0
    private let queueLimit: Int
    private let threadCount: Int
    private var started = false

    init(threads: Int, queueLimit: Int) {
        threadCount = threads
        self.queueLimit = queueLimit
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    /// Queues a job; false when the queue is full (the caller passes the image through).
    func submit(_ job: ImageJob) -> Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        if !started { start() }
        guard queue.count - head < queueLimit else { return false }
        queue.append(job)
        pthread_cond_signal(&condition)
        return true
    }

    private func start() {
        started = true
        for _ in 0..<threadCount {
            var thread = pthread_t()
            let context = Unmanaged.passRetained(self).toOpaque()
            pthread_create(&thread, nil, { context in
                let pool = Unmanaged<ImageTranscoder>.fromOpaque(context!).takeRetainedValue()
                pool.run()
                return nil
            }, context)
            pthread_detach(thread)
        }
    }

    private func next() -> ImageJob {
        pthread_mutex_lock(&mutex)
        while head == queue.count { pthread_cond_wait(&condition, &mutex) }
        let job = queue[head]
        head += 1
        if head == queue.count {
            queue.removeAll(keepingCapacity: true)
            head = 0
        }
        pthread_mutex_unlock(&mutex)
        return job
    }

    private func run() {
        dm_block_process_signals()
        // Below the event loops: on a busy machine the scheduler runs the proxying first and transcodes with
        // what is left (a Linux thread has its own nice value).
        dm_image_lower_thread_priority(10)
        while true {
            let job = next()
            let output = Self.transcode(job)
            job.worker.imageTranscoded(ImageResult(token: job.token, output: output))
        }
    }

    static func transcode(_ job: ImageJob) -> [UInt8]? {
        transcode(job.input, probe: job.probe, maxWidth: job.maxWidth, quality: job.quality, output: job.output)
    }

    /// Decode, resize, encode (on a pool thread). The C side refuses an image whose decoder sees another size
    /// than `probe` (the one checked against max-pixels).
    static func transcode(_ input: [UInt8], probe: ImageProbe, maxWidth: Int, quality: Int,
                          output: ImageProbe.Format) -> [UInt8]? {
        var info = dm_image_info(format: probe.format.rawValue, width: UInt32(probe.width),
                                 height: UInt32(probe.height), animated: 0)
        var out: UnsafeMutablePointer<UInt8>?
        var length = 0
        let status = input.withUnsafeBufferPointer {
            dm_image_transcode($0.baseAddress, $0.count, &info, UInt32(maxWidth), Int32(quality),
                               output.rawValue, &out, &length)
        }
        guard status == 0, let out else { return nil }
        defer { dm_image_free(out) }
        return Array(UnsafeBufferPointer(start: out, count: length))
    }
}

/// Transcoded images by URL, validators and output format (SPEC §13), bounded in bytes, least recently used
/// out first. Shared by the workers (a mutex; one lookup per transcodable image, never on other responses).
final class ImageCache: Sendable {
    static let shared = ImageCache(capacity: 64 << 20)

    struct Key: Hashable, Sendable {
        var url: String
        var etag: String?
        var lastModified: String?
        var format: ImageProbe.Format
        var maxWidth: Int
        var quality: Int
    }

    private struct Entry {
        var bytes: [UInt8]
        var used: UInt64
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var size = 0
        var clock: UInt64 = 0
    }

    private let state = Mutex(State())
    let capacity: Int

    init(capacity: Int) {
        self.capacity = capacity
    }

    func get(_ key: Key) -> [UInt8]? {
        state.withLock { state in
            guard var entry = state.entries[key] else { return nil }
            state.clock += 1
            entry.used = state.clock
            state.entries[key] = entry
            return entry.bytes
        }
    }

    func put(_ key: Key, _ bytes: [UInt8]) {
        guard bytes.count <= capacity / 8 else { return }
        state.withLock { state in
            state.clock += 1
            if let old = state.entries.updateValue(Entry(bytes: bytes, used: state.clock), forKey: key) {
                state.size -= old.bytes.count
            }
            state.size += bytes.count
            while state.size > capacity, let oldest = state.entries.min(by: { $0.value.used < $1.value.used }) {
                state.entries.removeValue(forKey: oldest.key)
                state.size -= oldest.value.bytes.count
            }
        }
    }
}
