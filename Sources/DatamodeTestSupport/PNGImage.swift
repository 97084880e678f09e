/// A PNG image as 8-bit RGBA pixels: decoded from what a browser's screenshot writes, or made in a test (a solid
/// rectangle of one colour) and encoded to serve as a real image.
///
/// Self-contained on purpose: Foundation has no zlib on Linux, so the decoder carries its own inflate (RFC 1951,
/// written after zlib's `puff.c`: canonical Huffman codes decoded bit by bit) and the encoder writes stored
/// (uncompressed) deflate blocks, which every PNG reader accepts. Decoding is strict and bounded: 8-bit RGB or
/// RGBA, greyscale or palette, not interlaced, CRCs and the Adler-32 checked; anything else is an error that says what.
public struct PNGImage: Equatable, Sendable {
    public struct RGBA: Equatable, Sendable, CustomStringConvertible {
        public var red, green, blue, alpha: UInt8
        public init(_ red: UInt8, _ green: UInt8, _ blue: UInt8, _ alpha: UInt8 = 255) {
            self.red = red
            self.green = green
            self.blue = blue
            self.alpha = alpha
        }

        /// Whether each channel is within `tolerance` of `other`'s (scaling and colour management move values a little).
        public func isClose(to other: RGBA, tolerance: Int = 24) -> Bool {
            abs(Int(red) - Int(other.red)) <= tolerance && abs(Int(green) - Int(other.green)) <= tolerance
                && abs(Int(blue) - Int(other.blue)) <= tolerance && abs(Int(alpha) - Int(other.alpha)) <= tolerance
        }

        public var description: String { "rgba(\(red), \(green), \(blue), \(alpha))" }
    }

    public struct DecodeError: Error, CustomStringConvertible {
        public var description: String
    }

    public let width: Int
    public let height: Int
    /// Row-major, 4 bytes per pixel.
    public let pixels: [UInt8]

    /// A `width` × `height` image of one colour.
    public init(width: Int, height: Int, fill: RGBA) {
        precondition(width > 0 && height > 0)
        self.width = width
        self.height = height
        var pixels = [UInt8]()
        pixels.reserveCapacity(width * height * 4)
        for _ in 0..<(width * height) { pixels += [fill.red, fill.green, fill.blue, fill.alpha] }
        self.pixels = pixels
    }

    public func pixel(x: Int, y: Int) -> RGBA {
        precondition(x >= 0 && x < width && y >= 0 && y < height, "pixel (\(x), \(y)) outside \(width)×\(height)")
        let at = (y * width + x) * 4
        return RGBA(pixels[at], pixels[at + 1], pixels[at + 2], pixels[at + 3])
    }

    // MARK: - Encoding

    /// The image as a PNG file: RGBA, 8 bits, filter 0 on every row, stored deflate blocks.
    public func encoded() -> [UInt8] {
        var raw = [UInt8]()
        raw.reserveCapacity(height * (width * 4 + 1))
        for y in 0..<height {
            raw.append(0)
            raw += pixels[(y * width * 4)..<((y + 1) * width * 4)]
        }
        var zlib: [UInt8] = [0x78, 0x01]
        var offset = 0
        repeat {
            let count = min(65_535, raw.count - offset)
            let final: UInt8 = offset + count == raw.count ? 1 : 0
            zlib += [final, UInt8(count & 0xFF), UInt8(count >> 8), UInt8(~count & 0xFF), UInt8((~count >> 8) & 0xFF)]
            zlib += raw[offset..<(offset + count)]
            offset += count
        } while offset < raw.count
        zlib += Self.bigEndian(Self.adler32(raw))

        var file: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
        var header = Self.bigEndian(UInt32(width)) + Self.bigEndian(UInt32(height))
        header += [8, 6, 0, 0, 0]   // 8 bits, RGBA, deflate, filter method 0, no interlace
        Self.appendChunk("IHDR", header, to: &file)
        Self.appendChunk("IDAT", zlib, to: &file)
        Self.appendChunk("IEND", [], to: &file)
        return file
    }

    private static func appendChunk(_ type: String, _ data: [UInt8], to file: inout [UInt8]) {
        let typeBytes = Array(type.utf8)
        file += bigEndian(UInt32(data.count))
        file += typeBytes
        file += data
        file += bigEndian(crc32(typeBytes + data))
    }

    private static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
    }

    private static let crcTable: [UInt32] = (0..<256).map { n in
        var c = UInt32(n)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var c: UInt32 = 0xFFFF_FFFF
        for byte in bytes { c = crcTable[Int((c ^ UInt32(byte)) & 0xFF)] ^ (c >> 8) }
        return c ^ 0xFFFF_FFFF
    }

    static func adler32(_ bytes: [UInt8]) -> UInt32 {
        var a: UInt32 = 1
        var b: UInt32 = 0
        for byte in bytes {
            a = (a + UInt32(byte)) % 65_521
            b = (b + a) % 65_521
        }
        return b << 16 | a
    }

    // MARK: - Decoding

    /// At most this many pixels (a screenshot is far smaller): a hostile header cannot make the decoder allocate more.
    public static let maximumPixels = 64 * 1024 * 1024

    public init(decoding file: [UInt8]) throws {
        let signature: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
        guard file.count >= 8, Array(file[0..<8]) == signature else { throw DecodeError(description: "not a PNG (no signature)") }
        var at = 8
        var header: [UInt8]?
        var palette: [UInt8] = []
        var compressed: [UInt8] = []
        var ended = false
        while !ended {
            guard at + 12 <= file.count else { throw DecodeError(description: "truncated chunk at byte \(at)") }
            let length = Int(file[at]) << 24 | Int(file[at + 1]) << 16 | Int(file[at + 2]) << 8 | Int(file[at + 3])
            guard length <= file.count - at - 12 else { throw DecodeError(description: "chunk length \(length) past the end") }
            let typeAndData = Array(file[(at + 4)..<(at + 8 + length)])
            let stored = UInt32(file[at + 8 + length]) << 24 | UInt32(file[at + 9 + length]) << 16
                | UInt32(file[at + 10 + length]) << 8 | UInt32(file[at + 11 + length])
            let type = String(decoding: typeAndData[0..<4], as: UTF8.self)
            guard Self.crc32(typeAndData) == stored else { throw DecodeError(description: "bad CRC on chunk \(type)") }
            let data = Array(typeAndData[4...])
            switch type {
            case "IHDR": header = data
            case "PLTE": palette = data
            case "IDAT": compressed += data
            case "IEND": ended = true
            default: break   // ancillary chunks (sRGB, pHYs, ...) change no pixel value we compare
            }
            at += 12 + length
        }
        guard let header, header.count == 13 else { throw DecodeError(description: "no valid IHDR") }
        let width = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
        let height = Int(header[4]) << 24 | Int(header[5]) << 16 | Int(header[6]) << 8 | Int(header[7])
        let (depth, colourType, interlace) = (header[8], header[9], header[12])
        guard width > 0, height > 0, width <= Self.maximumPixels / height else {
            throw DecodeError(description: "unsupported size \(width)×\(height)")
        }
        guard depth == 8 else { throw DecodeError(description: "unsupported bit depth \(depth) (8 only)") }
        guard interlace == 0 else { throw DecodeError(description: "interlaced PNGs are not supported") }
        let channels: Int
        switch colourType {
        case 0: channels = 1
        case 2: channels = 3
        case 3: channels = 1
        case 4: channels = 2
        case 6: channels = 4
        default: throw DecodeError(description: "unsupported colour type \(colourType)")
        }
        guard compressed.count >= 6, compressed[0] & 0x0F == 8, (Int(compressed[0]) << 8 | Int(compressed[1])) % 31 == 0 else {
            throw DecodeError(description: "IDAT is not a zlib stream")
        }
        let stride = width * channels
        var inflater = Inflater(Array(compressed[2...]), limit: height * (stride + 1))
        let raw = try inflater.inflate()
        guard raw.count == height * (stride + 1) else {
            throw DecodeError(description: "image data is \(raw.count) bytes, expected \(height * (stride + 1))")
        }
        let trailer = inflater.afterLastBlock()
        guard trailer.count >= 4,
              UInt32(trailer[0]) << 24 | UInt32(trailer[1]) << 16 | UInt32(trailer[2]) << 8 | UInt32(trailer[3]) == Self.adler32(raw) else {
            throw DecodeError(description: "bad Adler-32 after the image data")
        }

        var rows = [UInt8](repeating: 0, count: height * stride)
        for y in 0..<height {
            let filter = raw[y * (stride + 1)]
            let source = y * (stride + 1) + 1
            let line = y * stride
            for i in 0..<stride {
                let left = i >= channels ? Int(rows[line + i - channels]) : 0
                let up = y > 0 ? Int(rows[line - stride + i]) : 0
                let upLeft = (y > 0 && i >= channels) ? Int(rows[line - stride + i - channels]) : 0
                let predictor: Int
                switch filter {
                case 0: predictor = 0
                case 1: predictor = left
                case 2: predictor = up
                case 3: predictor = (left + up) / 2
                case 4:
                    let p = left + up - upLeft
                    let (pa, pb, pc) = (abs(p - left), abs(p - up), abs(p - upLeft))
                    predictor = pa <= pb && pa <= pc ? left : (pb <= pc ? up : upLeft)
                default: throw DecodeError(description: "bad filter type \(filter) on row \(y)")
                }
                rows[line + i] = UInt8((Int(raw[source + i]) + predictor) & 0xFF)
            }
        }

        var pixels = [UInt8]()
        pixels.reserveCapacity(width * height * 4)
        for p in 0..<(width * height) {
            let s = p * channels
            switch colourType {
            case 0: pixels += [rows[s], rows[s], rows[s], 255]
            case 2: pixels += [rows[s], rows[s + 1], rows[s + 2], 255]
            case 3:
                let index = Int(rows[s]) * 3
                guard index + 2 < palette.count else { throw DecodeError(description: "palette index \(rows[s]) outside PLTE") }
                pixels += [palette[index], palette[index + 1], palette[index + 2], 255]
            case 4: pixels += [rows[s], rows[s], rows[s], rows[s + 1]]
            default: pixels += [rows[s], rows[s + 1], rows[s + 2], rows[s + 3]]
            }
        }
        self.width = width
        self.height = height
        self.pixels = pixels
    }
}

/// Inflate (RFC 1951) of a raw deflate stream, bounded: more output than `limit` is an error.
struct Inflater {
    private let input: [UInt8]
    private var position = 0
    private var bitBuffer = 0
    private var bitCount = 0
    private let limit: Int
    private var output: [UInt8] = []

    init(_ input: [UInt8], limit: Int) {
        self.input = input
        self.limit = limit
    }

    private struct Huffman {
        var counts: [Int]    // codes of each length 0...15
        var symbols: [Int]   // symbols ordered by code

        init(lengths: [Int]) throws {
            counts = [Int](repeating: 0, count: 16)
            for length in lengths { counts[length] += 1 }
            var left = 1
            for length in 1..<16 {
                left = left * 2 - counts[length]
                if left < 0 { throw PNGImage.DecodeError(description: "over-subscribed Huffman code") }
            }
            var offsets = [Int](repeating: 0, count: 16)
            for length in 1..<15 { offsets[length + 1] = offsets[length] + counts[length] }
            symbols = [Int](repeating: 0, count: lengths.count)
            for (symbol, length) in lengths.enumerated() where length != 0 {
                symbols[offsets[length]] = symbol
                offsets[length] += 1
            }
        }
    }

    private mutating func bits(_ need: Int) throws -> Int {
        while bitCount < need {
            guard position < input.count else { throw PNGImage.DecodeError(description: "deflate stream ends early") }
            bitBuffer |= Int(input[position]) << bitCount
            position += 1
            bitCount += 8
        }
        let value = bitBuffer & ((1 << need) - 1)
        bitBuffer >>= need
        bitCount -= need
        return value
    }

    private mutating func decode(_ huffman: Huffman) throws -> Int {
        var code = 0, first = 0, index = 0
        for length in 1..<16 {
            code |= try bits(1)
            let count = huffman.counts[length]
            if code - count < first { return huffman.symbols[index + (code - first)] }
            index += count
            first = (first + count) << 1
            code <<= 1
        }
        throw PNGImage.DecodeError(description: "invalid Huffman code")
    }

    private static let lengthBase = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115,
                                     131, 163, 195, 227, 258]
    private static let lengthExtra = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0]
    private static let distanceBase = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025,
                                       1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]
    private static let distanceExtra = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12,
                                        12, 13, 13]

    private mutating func codes(_ literal: Huffman, _ distance: Huffman) throws {
        while true {
            let symbol = try decode(literal)
            if symbol < 256 {
                guard output.count < limit else { throw PNGImage.DecodeError(description: "more image data than the header says") }
                output.append(UInt8(symbol))
            } else if symbol == 256 {
                return
            } else {
                let s = symbol - 257
                guard s < 29 else { throw PNGImage.DecodeError(description: "bad length symbol \(symbol)") }
                let length = Self.lengthBase[s] + (try bits(Self.lengthExtra[s]))
                let d = try decode(distance)
                guard d < 30 else { throw PNGImage.DecodeError(description: "bad distance symbol \(d)") }
                let back = Self.distanceBase[d] + (try bits(Self.distanceExtra[d]))
                guard back <= output.count else { throw PNGImage.DecodeError(description: "distance \(back) too far back") }
                guard output.count + length <= limit else { throw PNGImage.DecodeError(description: "more image data than the header says") }
                for _ in 0..<length { output.append(output[output.count - back]) }
            }
        }
    }

    private mutating func stored() throws {
        bitBuffer = 0
        bitCount = 0
        guard position + 4 <= input.count else { throw PNGImage.DecodeError(description: "truncated stored block") }
        let length = Int(input[position]) | Int(input[position + 1]) << 8
        let complement = Int(input[position + 2]) | Int(input[position + 3]) << 8
        guard length == ~complement & 0xFFFF else { throw PNGImage.DecodeError(description: "stored block length check failed") }
        position += 4
        guard position + length <= input.count else { throw PNGImage.DecodeError(description: "truncated stored block") }
        guard output.count + length <= limit else { throw PNGImage.DecodeError(description: "more image data than the header says") }
        output += input[position..<(position + length)]
        position += length
    }

    private static let fixed: (Huffman, Huffman) = {
        var lengths = [Int](repeating: 8, count: 288)
        for i in 144..<256 { lengths[i] = 9 }
        for i in 256..<280 { lengths[i] = 7 }
        // swiftlint:disable:next force_try
        return (try! Huffman(lengths: lengths), try! Huffman(lengths: [Int](repeating: 5, count: 30)))
    }()

    private mutating func dynamic() throws {
        let literalCount = try bits(5) + 257
        let distanceCount = try bits(5) + 1
        let codeCount = try bits(4) + 4
        guard literalCount <= 286, distanceCount <= 30 else { throw PNGImage.DecodeError(description: "bad dynamic block counts") }
        let order = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15]
        var codeLengths = [Int](repeating: 0, count: 19)
        for i in 0..<codeCount { codeLengths[order[i]] = try bits(3) }
        let lengthCode = try Huffman(lengths: codeLengths)
        var lengths = [Int]()
        while lengths.count < literalCount + distanceCount {
            let symbol = try decode(lengthCode)
            switch symbol {
            case 0..<16: lengths.append(symbol)
            case 16:
                guard let previous = lengths.last else { throw PNGImage.DecodeError(description: "repeat with no previous length") }
                lengths += [Int](repeating: previous, count: 3 + (try bits(2)))
            case 17: lengths += [Int](repeating: 0, count: 3 + (try bits(3)))
            default: lengths += [Int](repeating: 0, count: 11 + (try bits(7)))
            }
        }
        guard lengths.count == literalCount + distanceCount else { throw PNGImage.DecodeError(description: "too many code lengths") }
        try codes(Huffman(lengths: Array(lengths[0..<literalCount])), Huffman(lengths: Array(lengths[literalCount...])))
    }

    mutating func inflate() throws -> [UInt8] {
        var last = 0
        repeat {
            last = try bits(1)
            switch try bits(2) {
            case 0: try stored()
            case 1: try codes(Self.fixed.0, Self.fixed.1)
            case 2: try dynamic()
            default: throw PNGImage.DecodeError(description: "reserved deflate block type")
            }
        } while last == 0
        return output
    }

    /// The bytes after the final block (the zlib trailer), from the next byte boundary.
    func afterLastBlock() -> [UInt8] {
        Array(input[min(input.count, position)...])
    }
}
