import CLibevent
@testable import DatamodeEngine
import DatamodeHTTP
import Testing

/// Heads and chunk lines at the front of an evbuffer are parsed without copying the body behind them, however
/// the buffer's chains split them.
@Suite struct FrontParseTests {
    /// An evbuffer whose chains are exactly `pieces` (each added by reference: one chain each).
    final class Chains {
        let buffer = evbuffer_new()!
        private var storage: [UnsafeMutableRawBufferPointer] = []

        init(_ pieces: [[UInt8]]) {
            for piece in pieces where !piece.isEmpty {
                let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: piece.count, alignment: 1)
                copy.copyBytes(from: piece)
                storage.append(copy)
                evbuffer_add_reference(buffer, copy.baseAddress, piece.count, nil, nil)
            }
        }

        deinit {
            evbuffer_free(buffer)
            for piece in storage { piece.deallocate() }
        }
    }

    static let head = Array("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 102400\r\n\r\n".utf8)
    static let body = [UInt8](repeating: 0x61, count: 102_400)

    @Test(arguments: [1, 7, 20, 60, 83])
    func aHeadSplitAcrossChainsIsParsedWithoutPullingUpTheBody(split: Int) {
        let chains = Chains([Array(Self.head[..<split]), Array(Self.head[split...]), Self.body])
        let result = FrontParse.parse(chains.buffer, limit: Flow.maxResponseHeadBytes, incomplete: HeadParseResult<ResponseHead>.incomplete,
                                      isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits)
        }
        guard case .complete(let parsed, let length) = result else {
            Issue.record("not parsed: \(result)")
            return
        }
        #expect(length == Self.head.count)
        #expect(parsed.status == 200)
        // At most a small prefix was made contiguous: the body's chain was not copied into it.
        #expect(evbuffer_get_contiguous_space(chains.buffer) < 4096)
        #expect(evbuffer_get_length(chains.buffer) == Self.head.count + Self.body.count)
    }

    @Test func anIncompleteHeadStaysIncompleteAndATooLargeOneIsRefused() {
        let partial = Chains([Array(Self.head[..<30]), Array(Self.head[30..<50])])
        let incomplete = FrontParse.parse(partial.buffer, limit: 1024, incomplete: HeadParseResult<ResponseHead>.incomplete,
                                          isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits)
        }
        if case .incomplete = incomplete {} else { Issue.record("expected incomplete, got \(incomplete)") }

        let huge = Chains([Array("HTTP/1.1 200 OK\r\nX: ".utf8), [UInt8](repeating: 0x62, count: 200_000)])
        let refused = FrontParse.parse(huge.buffer, limit: Flow.maxResponseHeadBytes, incomplete: HeadParseResult<ResponseHead>.incomplete,
                                       isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits)
        }
        if case .invalid = refused {} else { Issue.record("expected a refusal, got \(refused)") }
    }
}
