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

/// Identifies the exchange a job belongs to; read only on the worker's thread. Weak: an exchange whose connection
/// closed while its image was transcoding is simply gone when the result arrives.
final class ImageJobToken: @unchecked Sendable {
    weak var driver: ExchangeDriver?

    init(driver: ExchangeDriver) {
        self.driver = driver
    }
}

struct ImageResult: @unchecked Sendable {
    var token: ImageJobToken
    var outcome: TranscodeOutcome
}

/// Bounds on the work of one transcode (issue 24). `max-pixels` bounds the pixels of an image, not the passes a
/// decoder makes over them: a 50 KB progressive JPEG of 6000×6000 with 3,000 scans that add nothing kept a pool
/// thread decoding for tens of seconds (and every image queued behind it waiting). Fixed, not configured
/// (README "Images"): an image that runs into one passes untouched and is counted.
struct ImageLimits: Sendable {
    /// More scans than this and a JPEG is given up, as djpeg's `-maxscans` and TurboJPEG's scan limit do. Encoders
    /// write 1 (baseline) to about a dozen (libjpeg's progressive script: 10 for colour); 100 is far above them,
    /// and 100 scans over 6000×6000 cost about 0.8 s of CPU (the time budget below still applies).
    var maxScans: Int
    /// CPU time of the pool thread for the whole transcode (decode, resize, encode). The most expensive images
    /// max-pixels lets through (40 Mpx PNG or WebP, a progressive 40 Mpx JPEG) took 0.3–0.8 s of CPU on the 2-core
    /// machine of the README's measurements: 2 s leaves room for a slower one. CPU time, not wall time: the pool
    /// runs below the event loops' priority, so on a busy machine a wall-clock budget would measure the load and
    /// give up on ordinary images.
    var cpuBudget: Duration

    static let standard = ImageLimits(maxScans: 100, cpuBudget: .seconds(2))
}

/// How a transcode ended.
enum TranscodeOutcome: Sendable, Equatable, CustomStringConvertible {
    /// The encoded image (maybe not smaller than the original: the caller decides).
    case encoded([UInt8])
    /// Not decodable or encodable: corrupt, another size than probed, out of memory.
    case failed
    /// A JPEG with more scans than `ImageLimits.maxScans`.
    case tooManyScans
    /// `ImageLimits.cpuBudget` used up.
    case tooSlow

    var description: String {
        switch self {
        case .encoded(let bytes): "encoded(\(bytes.count) bytes)"
        case .failed: "failed"
        case .tooManyScans: "tooManyScans"
        case .tooSlow: "tooSlow"
        }
    }
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
    let threadCount: Int
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
            let outcome = Self.transcode(job)
            job.worker.imageTranscoded(ImageResult(token: job.token, outcome: outcome))
        }
    }

    static func transcode(_ job: ImageJob) -> TranscodeOutcome {
        transcode(job.input, probe: job.probe, maxWidth: job.maxWidth, quality: job.quality, output: job.output)
    }

    /// Decode, resize, encode (on a pool thread), within `limits`. The C side refuses an image whose decoder sees
    /// another size than `probe` (the one checked against max-pixels).
    static func transcode(_ input: [UInt8], probe: ImageProbe, maxWidth: Int, quality: Int,
                          output: ImageProbe.Format, limits: ImageLimits = .standard) -> TranscodeOutcome {
        var info = dm_image_info(format: probe.format.rawValue, width: UInt32(probe.width),
                                 height: UInt32(probe.height), animated: 0)
        let budget = limits.cpuBudget.components
        var bounds = dm_image_limits(max_scans: Int32(clamping: limits.maxScans),
                                     cpu_budget_ns: UInt64(budget.seconds) * 1_000_000_000
                                         + UInt64(budget.attoseconds / 1_000_000_000))
        var out: UnsafeMutablePointer<UInt8>?
        var length = 0
        let status = input.withUnsafeBufferPointer {
            dm_image_transcode($0.baseAddress, $0.count, &info, UInt32(maxWidth), Int32(quality),
                               output.rawValue, &bounds, &out, &length)
        }
        switch status {
        case DM_IMAGE_OK.rawValue:
            guard let out else { return .failed }
            defer { dm_image_free(out) }
            return .encoded(Array(UnsafeBufferPointer(start: out, count: length)))
        case DM_IMAGE_TOO_MANY_SCANS.rawValue: return .tooManyScans
        case DM_IMAGE_TOO_SLOW.rawValue: return .tooSlow
        default: return .failed
        }
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
