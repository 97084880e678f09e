/// Hand-built HTTP/2 frames and HPACK blocks (RFC 9113 §4, §6; RFC 7541 §5, §6), for the malformed and hostile
/// inputs a real client library refuses to produce. Written from the RFCs, independently of nghttp2.
import DatamodeHTTP2

enum Wire {
    static let preface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    static let data: UInt8 = 0x0, headers: UInt8 = 0x1, priority: UInt8 = 0x2, rstStream: UInt8 = 0x3
    static let settings: UInt8 = 0x4, ping: UInt8 = 0x6, goaway: UInt8 = 0x7, windowUpdate: UInt8 = 0x8
    static let continuation: UInt8 = 0x9
    static let endStream: UInt8 = 0x1, ack: UInt8 = 0x1, endHeaders: UInt8 = 0x4, padded: UInt8 = 0x8

    static func frame(_ type: UInt8, flags: UInt8 = 0, stream: Int32, _ payload: [UInt8] = []) -> [UInt8] {
        let n = payload.count
        return [UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff), type, flags] + be32(UInt32(stream)) + payload
    }

    static func settingsFrame(_ entries: [(UInt16, UInt32)] = []) -> [UInt8] {
        frame(settings, stream: 0, entries.flatMap { [UInt8($0.0 >> 8), UInt8($0.0 & 0xff)] + be32($0.1) })
    }

    static let settingsAck = frame(settings, flags: ack, stream: 0)

    /// The preface and an empty SETTINGS: what a client sends first.
    static let clientStart = preface + settingsFrame()

    static func headersFrame(_ stream: Int32, _ block: [UInt8], endStream: Bool = true, endHeaders: Bool = true) -> [UInt8] {
        frame(headers, flags: (endStream ? Wire.endStream : 0) | (endHeaders ? Wire.endHeaders : 0), stream: stream, block)
    }

    static func continuationFrame(_ stream: Int32, _ block: [UInt8], endHeaders: Bool) -> [UInt8] {
        frame(continuation, flags: endHeaders ? Wire.endHeaders : 0, stream: stream, block)
    }

    static func dataFrame(_ stream: Int32, _ bytes: [UInt8], endStream: Bool = false) -> [UInt8] {
        frame(data, flags: endStream ? Wire.endStream : 0, stream: stream, bytes)
    }

    static func rstFrame(_ stream: Int32, _ code: HTTP2ErrorCode) -> [UInt8] {
        frame(rstStream, stream: stream, be32(code.rawValue))
    }

    static func pingFrame(_ n: UInt64) -> [UInt8] {
        frame(ping, stream: 0, (0..<8).map { UInt8(n >> (56 - 8 * UInt64($0)) & 0xff) })
    }

    static func be32(_ v: UInt32) -> [UInt8] {
        [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)]
    }

    /// A request's header block: the four pseudo-headers (https, example.com, GET /) then `fields`, each a literal
    /// without indexing (RFC 7541 §6.2.2), not Huffman-coded, so any bytes at all can be sent.
    static func requestBlock(method: String = "GET", scheme: String? = "https", authority: String? = "example.com",
                             path: String? = "/", _ fields: [(String, String)] = []) -> [UInt8] {
        var pairs: [(String, String)] = [(":method", method)]
        if let scheme { pairs.append((":scheme", scheme)) }
        if let authority { pairs.append((":authority", authority)) }
        if let path { pairs.append((":path", path)) }
        return HPACK.block(pairs + fields)
    }
}

enum HPACK {
    /// RFC 7541 §5.1: an integer with an N-bit prefix, the other bits of the first byte set to `flags`.
    static func integer(_ value: Int, prefixBits: Int, flags: UInt8) -> [UInt8] {
        let max = (1 << prefixBits) - 1
        if value < max { return [flags | UInt8(value)] }
        var out = [flags | UInt8(max)]
        var rest = value - max
        while rest >= 128 {
            out.append(UInt8(rest % 128 + 128))
            rest /= 128
        }
        out.append(UInt8(rest))
        return out
    }

    static func string(_ bytes: [UInt8]) -> [UInt8] {
        integer(bytes.count, prefixBits: 7, flags: 0) + bytes
    }

    /// Literal header field without indexing, new name (RFC 7541 §6.2.2).
    static func literal(_ name: [UInt8], _ value: [UInt8]) -> [UInt8] {
        [0x00] + string(name) + string(value)
    }

    /// Literal header field with incremental indexing, new name (RFC 7541 §6.2.1): enters the dynamic table.
    static func literalIndexed(_ name: [UInt8], _ value: [UInt8]) -> [UInt8] {
        [0x40] + string(name) + string(value)
    }

    /// Indexed header field (RFC 7541 §6.1). The dynamic table starts at 62.
    static func indexed(_ index: Int) -> [UInt8] {
        integer(index, prefixBits: 7, flags: 0x80)
    }

    static func block(_ fields: [(String, String)]) -> [UInt8] {
        fields.flatMap { literal(Array($0.0.utf8), Array($0.1.utf8)) }
    }
}

/// A frame the server wrote.
struct RawFrame: Hashable {
    var type: UInt8
    var flags: UInt8
    var stream: Int32
    var payload: [UInt8]

    var errorCode: HTTP2ErrorCode? {
        switch type {
        case Wire.rstStream where payload.count == 4: HTTP2ErrorCode(rawValue: u32(payload, 0))
        case Wire.goaway where payload.count >= 8: HTTP2ErrorCode(rawValue: u32(payload, 4))
        default: nil
        }
    }

    var lastStreamID: Int32? {
        type == Wire.goaway && payload.count >= 8 ? Int32(bitPattern: u32(payload, 0) & 0x7fff_ffff) : nil
    }

    /// Whole frames in `bytes`; a partial frame at the end is an error of the writer.
    static func parse(_ bytes: [UInt8]) -> [RawFrame] {
        var frames: [RawFrame] = []
        var i = 0
        while i + 9 <= bytes.count {
            let length = Int(bytes[i]) << 16 | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2])
            guard i + 9 + length <= bytes.count else { break }
            frames.append(RawFrame(type: bytes[i + 3], flags: bytes[i + 4],
                                   stream: Int32(bitPattern: u32(bytes, i + 5) & 0x7fff_ffff),
                                   payload: Array(bytes[(i + 9)..<(i + 9 + length)])))
            i += 9 + length
        }
        precondition(i == bytes.count, "the server wrote a partial frame")
        return frames
    }
}

private func u32(_ b: [UInt8], _ i: Int) -> UInt32 {
    UInt32(b[i]) << 24 | UInt32(b[i + 1]) << 16 | UInt32(b[i + 2]) << 8 | UInt32(b[i + 3])
}

/// A test's clock: time moves only when the test says so.
final class TestClock {
    var nanoseconds: UInt64 = 1_000_000_000
    func advance(seconds: Double) { nanoseconds += UInt64(seconds * 1e9) }
}

/// The server session driven by raw bytes: what a hostile or broken client sends.
final class RawPeer {
    let server: HTTP2ServerSession
    let clock = TestClock()
    var events: [HTTP2ServerEvent] = []
    var output: [UInt8] = []

    init(_ configuration: HTTP2ServerConfiguration = HTTP2ServerConfiguration(), start: [UInt8] = Wire.clientStart) throws {
        let clock = clock
        server = try HTTP2ServerSession(configuration: configuration, now: { clock.nanoseconds })
        if !start.isEmpty { send(start) }
    }

    /// The bytes, in one read; then everything the server has to write.
    func send(_ bytes: [UInt8], flush: Bool = true) {
        events += bytes.withUnsafeBytes { server.receive($0) }
        if flush { self.flush() }
    }

    func flush() {
        events += server.writeOutput { output += $0 }
    }

    var frames: [RawFrame] { RawFrame.parse(output) }

    func rstCode(_ stream: Int32) -> HTTP2ErrorCode? {
        frames.last { $0.type == Wire.rstStream && $0.stream == stream }?.errorCode
    }

    var goaway: RawFrame? { frames.first { $0.type == Wire.goaway } }

    var requests: [(Int32, HTTP2Request)] {
        events.compactMap { if case .request(let id, let request, _) = $0 { (id, request) } else { nil } }
    }

    var refusals: [(Int32, HTTP2RequestRefusal)] {
        events.compactMap { if case .requestRefused(let id, let refusal) = $0 { (id, refusal) } else { nil } }
    }

    var connectionErrors: [HTTP2ConnectionError] {
        events.compactMap { if case .connectionError(let error) = $0 { error } else { nil } }
    }
}
