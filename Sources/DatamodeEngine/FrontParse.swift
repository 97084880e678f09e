import CLibevent
import DatamodeHTTP

/// Parses an element (a message head, a chunk-size line) at the front of an evbuffer without copying the body
/// behind it.
///
/// The element is parsed in place in the buffer's first chain when it fits there (the common case). Only when it
/// spans chains is a prefix made contiguous, and then a growing one (256 bytes, doubling) up to `limit`: pulling
/// up `limit` bytes at once copied whatever body followed the element (a whole 100 KiB response behind its head)
/// into a fresh allocation on every message, and page-faulted it in (bench/results/2026-11-24-profile-100k.md).
/// `package`: the fuzz target (DatamodeFuzz) drives it beside the reference parsers.
package enum FrontParse {
    /// A client's request head at the front of `input`, within the settings' limits.
    static func requestHead(_ input: OpaquePointer, settings: WorkerSettings) -> HeadParseResult<RequestHead> {
        let limits = settings.limits
        return parse(input, limit: settings.maxHeadBytes, incomplete: .incomplete,
                     isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseRequestHead($0, limits: limits)
        }
    }

    package static func parse<Result>(_ buffer: OpaquePointer, limit: Int, incomplete: Result,
                                      isIncomplete: (Result) -> Bool,
                                      _ body: (UnsafeRawBufferPointer) -> Result) -> Result {
        let available = evbuffer_get_length(buffer)
        guard available > 0 else { return incomplete }
        let contiguous = evbuffer_get_contiguous_space(buffer)
        var window = min(contiguous, limit)
        if window > 0, let start = evbuffer_pullup(buffer, window) {
            let result = body(UnsafeRawBufferPointer(start: start, count: window))
            if !isIncomplete(result) || window >= min(available, limit) { return result }
        }
        window = max(window, 128)
        while true {
            window = min(window * 2, available, limit)
            guard let start = evbuffer_pullup(buffer, window) else { return incomplete }
            let result = body(UnsafeRawBufferPointer(start: start, count: window))
            if !isIncomplete(result) || window >= min(available, limit) { return result }
        }
    }
}
