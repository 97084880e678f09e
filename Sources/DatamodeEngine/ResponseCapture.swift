import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodeMedia
import DatamodeState

/// A response body held back, bounded, while the proxy decides whether to rewrite it (SPEC §13: manifests and
/// images).
///
/// The body relay moves the origin's bytes here instead of to the client, exactly as it would have written them
/// (chunk framing included when the client gets chunks), so passing the response through untouched is writing
/// the head that was prepared and then these bytes, after which the relay goes on streaming as if nothing
/// happened. Only a complete body that the rewriter changes is replaced.
final class ResponseCapture {
    enum Phase {
        /// The first bytes decide whether this can be a master playlist or MPD at all.
        case sniffing
        /// It can: buffer the whole body (up to `limit`).
        case buffering
    }

    /// What the body may become.
    enum Purpose {
        /// A master playlist or MPD capped at this many bits per second.
        case manifest(cap: UInt64)
        /// An image transcoded with these settings; `acceptsWebP` from the request's `Accept`.
        case image(ImagesSection, acceptsWebP: Bool)
    }

    let purpose: Purpose
    let buffer: OpaquePointer = evbuffer_new()!
    /// The head that would have been relayed, written when the body passes through.
    let passThroughHead: [UInt8]
    let origin: ResponseHead
    /// The buffered bytes keep chunk framing (decoded before rewriting).
    let chunked: Bool
    var phase: Phase
    /// Above this many buffered bytes the body passes through.
    let limit: Int
    /// An image sent to the transcoding pool: its body and the machine's `.finish` action, carried out when the
    /// result comes back.
    var pendingImage: (body: [UInt8], key: ImageCache.Key?, format: ImageProbe.Format)?

    /// How much of the start of a body sniffing looks at before it gives up deciding.
    static let sniffWindow = 64 * 1024

    init(purpose: Purpose, passThroughHead: [UInt8], origin: ResponseHead, chunked: Bool, phase: Phase, limit: Int) {
        self.purpose = purpose
        self.passThroughHead = passThroughHead
        self.origin = origin
        self.chunked = chunked
        self.phase = phase
        self.limit = limit
    }

    deinit { evbuffer_free(buffer) }

    /// The first `count` buffered bytes (or all), contiguous, with chunk framing removed. `nil` when the framing
    /// is broken or, with `whole`, the last chunk has not arrived.
    func body(upTo count: Int? = nil, whole: Bool) -> [UInt8]? {
        let length = min(evbuffer_get_length(buffer), count ?? Int.max)
        var raw = [UInt8](repeating: 0, count: length)
        if length > 0 { _ = raw.withUnsafeMutableBytes { evbuffer_copyout(buffer, $0.baseAddress, length) } }
        guard chunked else { return raw }
        return Self.dechunk(raw, whole: whole)
    }

    static func dechunk(_ raw: [UInt8], whole: Bool) -> [UInt8]? {
        var decoder = ChunkedDecoder()
        var out: [UInt8] = []
        out.reserveCapacity(raw.count)
        var i = 0
        return raw.withUnsafeBytes { bytes -> [UInt8]? in
            while i < raw.count {
                if decoder.dataRemaining > 0 {
                    let n = min(Int(decoder.dataRemaining), raw.count - i)
                    out.append(contentsOf: raw[i..<(i + n)])
                    decoder.consumeData(n)
                    i += n
                    continue
                }
                switch decoder.parseFraming(UnsafeRawBufferPointer(rebasing: bytes[i...])) {
                case .needMore: return whole ? nil : out
                case .framing(let length): i += length
                case .end: return out
                case .invalid: return nil
                }
            }
            return whole ? nil : out
        }
    }
}
