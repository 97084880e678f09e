/// Random chunked bodies and chunk-size lines for differential tests of the chunked parsers: sizes of every length
/// and around every bound that matters (SPEC §6's 0x0fffffffffffffff, 2^63, 2^64), chunk extensions with BWS,
/// tokens and quoted strings, trailers, and byte mutations (flips, CR, LF, NUL, SP, HTAB, signs, deletions).
public enum ChunkedWireGenerator {
    static let hex = Array("0123456789abcdefABCDEF".utf8)
    static let tchars = Array("!#$%&'*+-.^_`|~09azAZ".utf8)
    /// Bytes that parsers disagree on, or that end or split a framing element.
    public static let nasty: [UInt8] = [0x0D, 0x0A, 0x00, 0x20, 0x09, 0x3B, 0x3D, 0x22, 0x5C, 0x78, 0x2B, 0x2D, 0x80, 0x7F,
                                        0x30, 0x66, 0x3A]

    /// Sizes a parser with a 63- or 64-bit accumulator, or with a digit limit, may read differently.
    public static let interestingSizes: [UInt64] = [
        0, 1, 5, 0xff, 0x0fff_ffff_ffff_fffe, 0x0fff_ffff_ffff_ffff, 0x1000_0000_0000_0000, 0x1000_0000_0000_0001,
        0x7fff_ffff_ffff_ffff, 0x8000_0000_0000_0000, 0x8000_0000_0000_0005, 0xffff_ffff_ffff_fffe, UInt64.max,
    ]

    /// The hex digits of `value`, in either case, sometimes zero-padded to 15, 16 or 17 digits.
    public static func digits(_ value: UInt64, using rng: inout SeededGenerator) -> [UInt8] {
        let digits = String(value, radix: 16, uppercase: Bool.random(using: &rng))
        let width = [digits.count, digits.count, digits.count + 1, digits.count + 2, 15, 16, 17].randomElement(using: &rng)!
        return Array((String(repeating: "0", count: max(0, width - digits.count)) + digits).utf8)
    }

    /// A chunk-size (digits only), mostly hard cases.
    public static func size(using rng: inout SeededGenerator) -> [UInt8] {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0:
            // 1...20 random digits (more than 16 never pass the digit cap, whatever their value).
            return (0..<Int.random(in: 1...20, using: &rng)).map { _ in hex.randomElement(using: &rng)! }
        case 1:
            var value = interestingSizes.randomElement(using: &rng)!
            if Bool.random(using: &rng) { value = value &+ UInt64.random(in: 0...2, using: &rng) &- 1 }
            return digits(value, using: &rng)
        case 2:
            // 2^64 and above: 17 digits whose low 16 are a small number (what a wrapping parser reads).
            return Array(("1" + String(repeating: "0", count: 15) + String(Int.random(in: 0...9, using: &rng))).utf8)
        default:
            return digits(UInt64.random(in: 0...0xffff, using: &rng), using: &rng)
        }
    }

    static func bws(using rng: inout SeededGenerator) -> [UInt8] {
        [[], [], [], [0x20], [0x09], [0x20, 0x20], [0x09, 0x20]].randomElement(using: &rng)!
    }

    static func token(using rng: inout SeededGenerator) -> [UInt8] {
        (0..<Int.random(in: 1...5, using: &rng)).map { _ in tchars.randomElement(using: &rng)! }
    }

    static func quoted(using rng: inout SeededGenerator) -> [UInt8] {
        var q: [UInt8] = [0x22]
        for _ in 0..<Int.random(in: 0...5, using: &rng) {
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: q += [0x5C, [0x22, 0x5C, 0x20, 0x61, 0x09].randomElement(using: &rng)!]
            case 1: q.append([0x20, 0x09, 0x3B, 0x3D, 0xC3].randomElement(using: &rng)!)
            default: q.append(UInt8.random(in: 0x61...0x7A, using: &rng))
            }
        }
        q.append(0x22)
        return q
    }

    /// Zero to three chunk extensions (`;name`, `;name=token`, `;name="quoted"`, with BWS), rarely a long one.
    public static func extensions(using rng: inout SeededGenerator) -> [UInt8] {
        var ext: [UInt8] = []
        for _ in 0..<[0, 0, 1, 1, 2, 3].randomElement(using: &rng)! {
            ext += bws(using: &rng) + [0x3B] + bws(using: &rng) + token(using: &rng)
            if Bool.random(using: &rng) {
                ext += bws(using: &rng) + [0x3D] + bws(using: &rng)
                ext += Bool.random(using: &rng) ? token(using: &rng) : quoted(using: &rng)
            }
        }
        if Int.random(in: 0..<50, using: &rng) == 0 {
            ext += [0x3B] + [UInt8](repeating: UInt8(ascii: "e"), count: Int.random(in: 10...40, using: &rng))
        }
        return ext
    }

    /// Up to `count` random mutations: a flipped bit, a byte replaced by or inserted as a nasty one, a deletion.
    public static func mutate(_ bytes: inout [UInt8], count: Int, using rng: inout SeededGenerator) {
        for _ in 0..<count {
            let at = Int.random(in: 0...bytes.count, using: &rng)
            switch Int.random(in: 0..<4, using: &rng) {
            case 0 where at < bytes.count: bytes[at] ^= UInt8(1) << UInt8.random(in: 0...7, using: &rng)
            case 1 where at < bytes.count: bytes[at] = nasty.randomElement(using: &rng)!
            case 2 where at < bytes.count: bytes.remove(at: at)
            default: bytes.insert(nasty.randomElement(using: &rng)!, at: at)
            }
        }
    }

    /// One chunk-size line without its CRLF, maybe mutated.
    public static func sizeLine(using rng: inout SeededGenerator) -> [UInt8] {
        var line = size(using: &rng) + extensions(using: &rng)
        mutate(&line, count: [0, 0, 0, 1, 1, 2, 3].randomElement(using: &rng)!, using: &rng)
        return line
    }

    /// A whole chunked body, usually well-formed before mutation, sometimes with a size that lies, a hard size, a
    /// long size line (around `ChunkedDecoder`'s 4 KiB line limit) or a long trailer section (around its 64 KiB
    /// limit), then maybe mutated and maybe followed by the next message's first bytes.
    public static func body(using rng: inout SeededGenerator) -> [UInt8] {
        var wire: [UInt8] = []
        for _ in 0..<Int.random(in: 0...4, using: &rng) {
            let data = (0..<Int.random(in: 1...40, using: &rng)).map { _ in
                Int.random(in: 0..<8, using: &rng) == 0 ? [0x0D, 0x0A, 0x30, 0x3B].randomElement(using: &rng)!
                    : UInt8.random(in: 0x61...0x7A, using: &rng)
            }
            switch Int.random(in: 0..<20, using: &rng) {
            case 0: wire += size(using: &rng)
            case 1: wire += digits(UInt64(max(0, data.count + Int.random(in: -2...2, using: &rng))), using: &rng)
            default: wire += digits(UInt64(data.count), using: &rng)
            }
            wire += extensions(using: &rng)
            if Int.random(in: 0..<200, using: &rng) == 0 {
                wire += [0x3B] + [UInt8](repeating: UInt8(ascii: "x"), count: Int.random(in: 4090...4100, using: &rng))
            }
            wire += Array("\r\n".utf8) + data + Array("\r\n".utf8)
        }
        wire += [0x30] + extensions(using: &rng) + Array("\r\n".utf8)
        for _ in 0..<[0, 0, 1, 2].randomElement(using: &rng)! {
            let name = ["Trailer-One", "X-Checksum", "Content-Length", "Host", "X"].randomElement(using: &rng)!
            wire += Array("\(name):\([" ", "", "  "].randomElement(using: &rng)!)v\(Int.random(in: 0...99, using: &rng))\r\n".utf8)
        }
        if Int.random(in: 0..<400, using: &rng) == 0 {
            let length = Int.random(in: 65_520...65_540, using: &rng)
            wire += Array("X-Long: ".utf8) + [UInt8](repeating: UInt8(ascii: "l"), count: length) + Array("\r\n".utf8)
        }
        wire += Array("\r\n".utf8)
        mutate(&wire, count: [0, 0, 1, 1, 2, 4].randomElement(using: &rng)!, using: &rng)
        if Bool.random(using: &rng) { wire += Array("GET http://next.example/ HTTP/1.1\r\n".utf8) }
        return wire
    }

    /// Cut points that split `count` bytes the way reads from a socket do: single bytes, small and large pieces.
    /// About `maxPieces` at most: a parser that starts over on every arrival costs their number times `count`.
    public static func pieces(_ count: Int, maxPieces: Int = 128, using rng: inout SeededGenerator) -> [Range<Int>] {
        var pieces: [Range<Int>] = []
        var at = 0
        let style = Int.random(in: 0..<4, using: &rng)
        let shortest = max(1, count / maxPieces)
        while at < count {
            var length: Int
            switch style {
            case 0: length = count  // all at once
            case 1: length = 1
            case 2: length = Int.random(in: 1...8, using: &rng)
            default: length = [1, 2, 3, 5, 17, 64, 300, 4096].randomElement(using: &rng)!
            }
            length = max(length, shortest)
            pieces.append(at..<min(count, at + length))
            at = min(count, at + length)
        }
        return pieces
    }
}
