/// What the first bytes of a connection on the transparent listener are (SPEC §16), read without consuming them:
/// the bytes stay in the session's input for whichever path takes the connection (the TLS filter, the HTTP
/// parser, a blind tunnel). Pure: bytes in, a classification out, every length bounds-checked, so it is
/// table-tested and fuzzed without sockets.
package enum TransparentOpening: Equatable {
    /// Not enough bytes to tell yet.
    case needMore
    /// A TLS ClientHello (RFC 8446 §4.1.2); `serverName`: its `server_name` (RFC 6066 §3) when it carries a valid
    /// DNS name, lowercased.
    case tls(serverName: String?)
    /// An HTTP/1.x request line (RFC 9112 §3): the connection is read as HTTP.
    case http
    /// Anything else: relayed blind.
    case other

    /// How many bytes classification may look at: a ClientHello larger than this (far beyond what clients send,
    /// ~2 KiB with post-quantum key shares) is taken as TLS without a name.
    package static let peekLimit = 16 * 1024 + 5 + 4 * 1024
    /// The longest method token taken as HTTP (RFC 9110 §9: methods are short tokens).
    static let maxMethodLength = 32

    /// Classifies the first bytes of a connection. `atEnd`: the client sent nothing more (EOF): what is
    /// incomplete now stays incomplete.
    package static func classify(_ bytes: UnsafeRawBufferPointer, requestLineLimit: Int, atEnd: Bool = false) -> TransparentOpening {
        guard let first = bytes.first else { return atEnd ? .other : .needMore }
        let result: TransparentOpening
        if first == 0x16 {
            switch ClientHello.serverName(in: bytes, limit: peekLimit) {
            case .incomplete: result = .needMore
            case .malformed: result = .other
            case .clientHello(let name): result = .tls(serverName: name)
            case .tooLarge: result = .tls(serverName: nil)
            }
        } else {
            result = requestLine(bytes, limit: requestLineLimit)
        }
        // Cut short by the client's EOF: whatever it is, it is not something the proxy can read.
        return result == .needMore && atEnd ? .other : result
    }

    /// `method SP request-target SP HTTP/1.x CRLF`, the line looked at only up to `limit` bytes. A line that is
    /// still a plausible prefix is `needMore`; anything else `other`.
    static func requestLine(_ bytes: UnsafeRawBufferPointer, limit: Int) -> TransparentOpening {
        var index = 0
        while index < bytes.count, index <= maxMethodLength, isTokenCharacter(bytes[index]) { index += 1 }
        guard index < bytes.count else { return index <= maxMethodLength ? .needMore : .other }
        guard index > 0, index <= maxMethodLength, bytes[index] == UInt8(ascii: " ") else { return .other }
        // The end of the line: LF (a CR before it is part of the line ending).
        var end = index
        while end < bytes.count, bytes[end] != UInt8(ascii: "\n") {
            // A control character other than CR, or a CR not followed by LF, is no request line (RFC 9112 §2.2).
            let byte = bytes[end]
            if byte == UInt8(ascii: "\r") {
                if end + 1 < bytes.count && bytes[end + 1] != UInt8(ascii: "\n") { return .other }
            } else if byte < 0x20 || byte == 0x7f {
                return .other
            }
            end += 1
            if end > limit { return .other }
        }
        guard end < bytes.count else { return .needMore }
        var lineEnd = end
        if lineEnd > index, bytes[lineEnd - 1] == UInt8(ascii: "\r") { lineEnd -= 1 }
        let version = Array("HTTP/1.".utf8)
        // " HTTP/1.d" at the end of the line, with a non-empty target between the two spaces.
        guard lineEnd - index >= version.count + 3 else { return .other }
        let versionStart = lineEnd - version.count - 1
        guard bytes[versionStart - 1] == UInt8(ascii: " "),
              (0..<version.count).allSatisfy({ bytes[versionStart + $0] == version[$0] }),
              bytes[lineEnd - 1] == UInt8(ascii: "0") || bytes[lineEnd - 1] == UInt8(ascii: "1"),
              versionStart - 1 > index + 1 else { return .other }
        return .http
    }

    /// tchar (RFC 9110 §5.6.2).
    @inline(__always)
    static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }
}

/// The `server_name` of a TLS ClientHello, read strictly: every length is checked against the bytes that hold it
/// and against the length of what encloses it, so a truncated or lying ClientHello is `incomplete` or `malformed`,
/// never a read out of bounds. The handshake message may span several records (RFC 8446 §5.1 lets a handshake
/// message be fragmented); their fragments are joined, bounded by `limit`.
package enum ClientHello {
    enum Result: Equatable {
        case incomplete
        case malformed
        /// A ClientHello; its host name when it names a valid one.
        case clientHello(String?)
        /// Well-formed as far as `limit` bytes, but longer: a TLS handshake whose name is not read.
        case tooLarge
    }

    /// TLSPlaintext.length may not exceed 2^14 (RFC 8446 §5.1).
    static let maxRecordLength = 1 << 14

    static func serverName(in bytes: UnsafeRawBufferPointer, limit: Int) -> Result {
        // Join the handshake records' fragments until the ClientHello is whole.
        var message: [UInt8] = []
        var offset = 0
        while true {
            guard offset + 5 <= bytes.count else { return offset + 5 > limit ? .tooLarge : .incomplete }
            // ContentType handshake (22); legacy_record_version 0x03 0x0?; length.
            guard bytes[offset] == 22, bytes[offset + 1] == 3, bytes[offset + 2] <= 4 else { return .malformed }
            let length = Int(bytes[offset + 3]) << 8 | Int(bytes[offset + 4])
            guard length > 0, length <= maxRecordLength else { return .malformed }
            let end = offset + 5 + length
            guard end <= bytes.count else { return end > limit ? .tooLarge : .incomplete }
            message.append(contentsOf: bytes[(offset + 5)..<end])
            offset = end
            // Handshake: msg_type client_hello (1), uint24 length.
            guard message.count >= 4 else { continue }
            guard message[0] == 1 else { return .malformed }
            let bodyLength = Int(message[1]) << 16 | Int(message[2]) << 8 | Int(message[3])
            if message.count >= 4 + bodyLength {
                return parseBody(message[4..<(4 + bodyLength)])
            }
            if 4 + bodyLength > limit { return .tooLarge }
        }
    }

    /// ClientHello: legacy_version, random, legacy_session_id, cipher_suites, legacy_compression_methods,
    /// extensions (absent in some TLS 1.2 ClientHellos: then no name).
    static func parseBody(_ body: ArraySlice<UInt8>) -> Result {
        var reader = Reader(body)
        guard reader.skip(2 + 32),
              let sessionID = reader.vector(lengthBytes: 1), sessionID.count <= 32,
              let suites = reader.vector(lengthBytes: 2), suites.count >= 2, suites.count % 2 == 0,
              let compression = reader.vector(lengthBytes: 1), !compression.isEmpty else { return .malformed }
        if reader.isAtEnd { return .clientHello(nil) }
        guard let extensions = reader.vector(lengthBytes: 2), reader.isAtEnd else { return .malformed }
        var list = Reader(extensions)
        var name: String?
        var seenServerName = false
        while !list.isAtEnd {
            guard let type = list.uint16(), let data = list.vector(lengthBytes: 2) else { return .malformed }
            guard type == 0 else { continue }
            // RFC 8446 §4.2: at most one extension of each type.
            guard !seenServerName else { return .malformed }
            seenServerName = true
            guard let parsed = serverNameList(data) else { return .malformed }
            name = parsed
        }
        return .clientHello(name)
    }

    /// ServerNameList (RFC 6066 §3): the host_name entry, if it is a valid DNS name; nil otherwise.
    /// nil (outer): the list's own lengths do not add up.
    static func serverNameList(_ data: ArraySlice<UInt8>) -> String?? {
        var reader = Reader(data)
        guard let list = reader.vector(lengthBytes: 2), reader.isAtEnd, !list.isEmpty else { return nil }
        var entries = Reader(list)
        var hostName: String?? = .some(nil)
        while !entries.isAtEnd {
            guard let type = entries.uint8(), let value = entries.vector(lengthBytes: 2), !value.isEmpty else { return nil }
            if type == 0, case .some(nil) = hostName { hostName = .some(validHostName(value)) }
        }
        return hostName
    }

    /// A DNS host name (RFC 1123 §2.1, RFC 6066 §3: no trailing dot, no IP literal): labels of letters, digits and
    /// hyphens, 1 to 63 bytes each, 253 in all; lowercased. Anything else (an injected space, a colon, a NUL) is
    /// not a name: the connection is then judged by its address.
    package static func validHostName(_ bytes: ArraySlice<UInt8>) -> String? {
        guard bytes.count <= 253 else { return nil }
        var label = 0
        var lowered: [UInt8] = []
        lowered.reserveCapacity(bytes.count)
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "."):
                guard label > 0 else { return nil }
                label = 0
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"):
                label += 1
            case UInt8(ascii: "A")...UInt8(ascii: "Z"):
                label += 1
            default:
                return nil
            }
            guard label <= 63 else { return nil }
            lowered.append(byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte)
        }
        guard label > 0 else { return nil }
        // An all-numeric last label is an IPv4 literal in disguise, which SNI must not carry.
        var lastLabel = lowered.count - 1
        while lastLabel > 0, lowered[lastLabel - 1] != UInt8(ascii: ".") { lastLabel -= 1 }
        guard !lowered[lastLabel...].allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return String(decoding: lowered, as: UTF8.self)
    }

    /// Reads big-endian integers and length-prefixed vectors, each checked against what is left.
    struct Reader {
        private var bytes: ArraySlice<UInt8>

        init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

        var isAtEnd: Bool { bytes.isEmpty }

        mutating func skip(_ count: Int) -> Bool {
            guard bytes.count >= count else { return false }
            bytes = bytes.dropFirst(count)
            return true
        }

        mutating func uint8() -> UInt8? {
            guard let first = bytes.first else { return nil }
            bytes = bytes.dropFirst()
            return first
        }

        mutating func uint16() -> UInt16? {
            guard bytes.count >= 2 else { return nil }
            let value = UInt16(bytes[bytes.startIndex]) << 8 | UInt16(bytes[bytes.startIndex + 1])
            bytes = bytes.dropFirst(2)
            return value
        }

        mutating func vector(lengthBytes: Int) -> ArraySlice<UInt8>? {
            guard bytes.count >= lengthBytes else { return nil }
            var length = 0
            for index in 0..<lengthBytes { length = length << 8 | Int(bytes[bytes.startIndex + index]) }
            guard bytes.count - lengthBytes >= length else { return nil }
            let start = bytes.startIndex + lengthBytes
            let value = bytes[start..<(start + length)]
            bytes = bytes[(start + length)...]
            return value
        }
    }
}
