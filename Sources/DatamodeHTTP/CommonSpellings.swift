/// Strings the HTTP/1 parser would otherwise build again for every message: a method, reason, field name or field
/// value spelled byte for byte as one of these is returned as the literal, with no String built and no UTF-8 check.
/// Building one costs ~195 instructions (`String(decoding:as:)`, callgrind) and a plain 1 KiB exchange builds 18
/// for field lines alone; a lookup costs a few dozen. Only exact spellings match (the client's spelling is kept,
/// `name` keeps its case), so the String is the same either way: `ASCII.string` is the reference
/// (`CommonSpellingsDifferentialTests`, and the fuzz target on every input).
enum CommonSpellings {
    /// Methods, status reasons, field names (as browsers, curl and servers spell them, and in lowercase as HTTP/2
    /// peers and some clients do) and the commonest short values.
    static let words: [String] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT",
        "OK", "Not Found", "Partial Content", "No Content", "Not Modified", "Found", "Moved Permanently",
        "Created", "Accepted", "Bad Request", "Forbidden", "Unauthorized", "Internal Server Error", "Bad Gateway",
        "Service Unavailable", "See Other", "Temporary Redirect", "Permanent Redirect",
        "Host", "User-Agent", "Accept", "Accept-Encoding", "Accept-Language", "Connection", "Cookie", "Referer",
        "Cache-Control", "Pragma", "Upgrade-Insecure-Requests", "Origin", "Content-Type", "Content-Length",
        "If-None-Match", "If-Modified-Since", "If-Range", "Range", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest",
        "Sec-Fetch-User", "Authorization", "Proxy-Authorization", "Proxy-Connection", "X-Requested-With", "Save-Data",
        "Allow-Constrained", "Allow-Expensive", "Allow-Ultra-Constrained", "Via", "Forwarded", "X-Forwarded-For",
        "Priority", "TE", "Upgrade", "Expect", "DNT",
        "Server", "Date", "Last-Modified", "ETag", "Etag", "Accept-Ranges", "Expires", "Vary", "Transfer-Encoding",
        "Content-Encoding", "Content-Range", "Location", "Set-Cookie", "Age", "Keep-Alive", "Strict-Transport-Security",
        "Access-Control-Allow-Origin", "X-Content-Type-Options", "X-Frame-Options", "Alt-Svc", "Data-Mode-Variant",
        "host", "user-agent", "accept", "accept-encoding", "accept-language", "connection", "cookie", "referer",
        "cache-control", "pragma", "upgrade-insecure-requests", "origin", "content-type", "content-length",
        "if-none-match", "if-modified-since", "if-range", "range", "sec-fetch-site", "sec-fetch-mode",
        "sec-fetch-dest", "sec-fetch-user", "authorization", "proxy-authorization", "proxy-connection", "save-data",
        "allow-constrained", "allow-expensive", "allow-ultra-constrained", "via", "forwarded", "x-forwarded-for",
        "priority", "te", "upgrade", "expect",
        "server", "date", "last-modified", "etag", "accept-ranges", "expires", "vary", "transfer-encoding",
        "content-encoding", "content-range", "location", "set-cookie", "age", "keep-alive",
        "strict-transport-security", "access-control-allow-origin", "x-content-type-options", "alt-svc",
        "close", "bytes", "chunked", "gzip", "br", "identity", "no-cache", "no-store", "*/*", "0", "1", "on", "?0", "?1",
        "websocket", "max-age=0", "nosniff", "text/html", "text/plain", "text/css", "application/json",
        "application/octet-stream", "application/javascript", "image/jpeg", "image/png", "image/webp", "image/gif",
        "video/mp4", "trailers", "Accept-Encoding", "accept-encoding, origin", "curl/7.88.1", "nginx",
    ]

    static let maxLength = 32

    /// `words` laid out for `lookUp`, made once and never freed: the bytes back to back, and an open-addressed hash
    /// table of (length, offset, word) slots. Plain pointers, so a lookup retains nothing (Swift arrays of tuples
    /// cost ~160 instructions a lookup).
    private struct Table: @unchecked Sendable {  // written once, in init, then only read
        static let slotCount = 512
        let bytes: UnsafeMutablePointer<UInt8>
        /// Per slot: the word's index + 1 (0: empty), its length and its offset in `bytes`.
        let slots: UnsafeMutablePointer<(word: Int32, length: Int32, offset: Int32)>
        let strings: UnsafeMutablePointer<String>

        init() {
            let unique = CommonSpellings.words.enumerated().filter { entry in
                !CommonSpellings.words[..<entry.offset].contains(entry.element)
            }.map(\.element)
            let all = unique.flatMap { Array($0.utf8) }
            bytes = .allocate(capacity: all.count)
            bytes.initialize(from: all, count: all.count)
            strings = .allocate(capacity: unique.count)
            strings.initialize(from: unique, count: unique.count)
            slots = .allocate(capacity: Self.slotCount)
            slots.initialize(repeating: (0, 0, 0), count: Self.slotCount)
            var offset = 0
            for (index, word) in unique.enumerated() {
                let length = word.utf8.count
                precondition(length > 0 && length <= CommonSpellings.maxLength)
                var slot = Self.hash(UnsafeRawPointer(bytes + offset), length)
                while slots[slot].word != 0 { slot = (slot + 1) & (Self.slotCount - 1) }
                slots[slot] = (Int32(index + 1), Int32(length), Int32(offset))
                offset += length
            }
        }

        @inline(__always)
        static func hash(_ p: UnsafeRawPointer, _ n: Int) -> Int {
            let first = Int(p.load(fromByteOffset: 0, as: UInt8.self))
            let middle = Int(p.load(fromByteOffset: n >> 1, as: UInt8.self))
            let last = Int(p.load(fromByteOffset: n - 1, as: UInt8.self))
            return (n &* 97 &+ first &* 31 &+ middle &* 7 &+ last) & (slotCount - 1)
        }
    }

    private static let table = Table()

    /// The String of `p[from..<to]` (valid UTF-8, as `ASCII.string` takes): one of `words` when it is spelled so.
    @inline(__always)
    static func string(_ p: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> String {
        let n = to - from
        if n > 0 && n <= maxLength, let base = p.baseAddress, let found = lookUp(base + from, n) { return found }
        return ASCII.string(p, from, to)
    }

    /// `string` for a field value: only short values are looked up (`keep-alive`, `bytes`, `chunked`, `?1`): a
    /// long one is almost never in `words` (dates, hosts, agents, cookies), and a lookup that misses costs half
    /// what building the String does.
    @inline(__always)
    static func value(_ p: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> String {
        let n = to - from
        if n > 0 && n <= maxValueLookup, let base = p.baseAddress, let found = lookUp(base + from, n) { return found }
        return ASCII.string(p, from, to)
    }

    static let maxValueLookup = 10

    @inline(__always)
    private static func lookUp(_ p: UnsafeRawPointer, _ n: Int) -> String? {
        let table = Self.table
        var slot = Table.hash(p, n)
        while true {
            let entry = table.slots[slot]
            if entry.word == 0 { return nil }
            if Int(entry.length) == n && same(p, UnsafeRawPointer(table.bytes + Int(entry.offset)), n) {
                return table.strings[Int(entry.word) - 1]
            }
            slot = (slot + 1) & (Table.slotCount - 1)
        }
    }

    @inline(__always)
    private static func same(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, _ n: Int) -> Bool {
        var k = 0
        while k + 8 <= n {
            if a.loadUnaligned(fromByteOffset: k, as: UInt64.self) != b.loadUnaligned(fromByteOffset: k, as: UInt64.self) {
                return false
            }
            k += 8
        }
        while k < n {
            if a.load(fromByteOffset: k, as: UInt8.self) != b.load(fromByteOffset: k, as: UInt8.self) { return false }
            k += 1
        }
        return true
    }
}

/// The parser's fast paths for a head's strings and names checked against their references on any bytes, for the
/// fuzz target (`CommonSpellingsDifferentialTests` runs the same comparisons on generated inputs).
package enum ParserFastPaths {
    /// What a fast path made of `p[from..<to]` that its reference did not, or nil when they agree.
    package static func disagreement(_ p: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> String? {
        let reference = ASCII.string(p, from, to)
        if CommonSpellings.string(p, from, to) != reference { return "CommonSpellings.string: \(reference)" }
        if CommonSpellings.value(p, from, to) != reference { return "CommonSpellings.value: \(reference)" }
        var end = from
        while end < to && ByteClass.isTchar(p[end]) { end += 1 }
        if FieldSection.nameEnd(p, from: from, to: to) != end { return "FieldSection.nameEnd of \(reference)" }
        return nil
    }
}
