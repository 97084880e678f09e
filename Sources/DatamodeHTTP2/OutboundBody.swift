import CNghttp2
import DatamodeHTTP

/// A message body on its way out, either side's (a response to a client, a request to an origin): bytes queued by
/// the engine, pulled by nghttp2 as the peer's windows allow.
struct OutboundBody {
    var bytes: [UInt8] = []
    var start = 0
    var finished = false
    var trailers: [HTTPField] = []
    /// nghttp2 was told DEFERRED and waits for `nghttp2_session_resume_data`.
    var deferred = false
    /// The engine was told "stop": a drained event is owed below the low watermark.
    var paused = false
    /// The engine reset the stream with bytes still queued here: they go out first, then RST_STREAM with this code
    /// (nghttp2 would send a reset ahead of them and drop them).
    var resetAfter: UInt32?
    var count: Int { bytes.count - start }

    /// nghttp2's data source read: copies what is queued into `buffer` (as much as fits), calls `drained` once the
    /// queue falls below `lowWatermark` after a stop, and at the end sets EOF, ending with trailers through
    /// `submitTrailers` (nghttp2's way: no END_STREAM on the last DATA, then a HEADERS frame); DEFERRED when the
    /// queue is empty and the body not finished. Returns the byte count or an nghttp2 error code.
    mutating func read(into buffer: UnsafeMutableRawBufferPointer, flags: UnsafeMutablePointer<UInt32>,
                       lowWatermark: Int, drained: () -> Void, submitTrailers: ([HTTPField]) -> Int32) -> Int {
        let n = min(count, buffer.count)
        if n > 0 {
            let from = start
            bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + from, byteCount: n) }
            start += n
            compact()
        }
        if paused && count < lowWatermark {
            paused = false
            drained()
        }
        guard count == 0 else { return n }
        if finished {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            if !trailers.isEmpty {
                flags.pointee |= NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
                if submitTrailers(trailers) != 0 { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
            }
        } else if n == 0 {
            deferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        return n
    }

    /// Drops sent bytes from the front once they are the larger part of the queue.
    private mutating func compact() {
        if start == bytes.count {
            bytes.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 64 * 1024 && start > bytes.count / 2 {
            bytes.removeFirst(start)
            start = 0
        }
    }
}
