extension SeededGenerator {
    /// `s`, now and then broken as the differential tests break their inputs: one in `odds` times one of `junk`
    /// inserted at a random place, one in `odds` times one byte replaced by any byte (which may leave invalid UTF-8,
    /// repaired as `String(decoding:)` does), otherwise `s` as it is.
    public mutating func mutated(_ s: String, junk: [String], odds: Int) -> String {
        switch Int.random(in: 0..<odds, using: &self) {
        case 0 where !junk.isEmpty:
            var s = s
            let cut = s.index(s.startIndex, offsetBy: Int.random(in: 0...s.count, using: &self))
            s.insert(contentsOf: junk.randomElement(using: &self)!, at: cut)
            return s
        case 1 where !s.isEmpty:
            var bytes = Array(s.utf8)
            bytes[Int.random(in: 0..<bytes.count, using: &self)] = UInt8.random(in: 0...255, using: &self)
            return String(decoding: bytes, as: UTF8.self)
        default:
            return s
        }
    }

    /// An authority as a request-target carries it (a host, maybe a port), with the bytes that end or break one
    /// inserted now and then: the target differential tests' input.
    public mutating func authority() -> String {
        let hosts = ["example.com", "a", "A-b_c~d", "192.0.2.1", "[::1]", "[2001:DB8::a]", "[::ffff:192.0.2.1]",
                     "[1:2:3:4:5:6:7:8]", "%41b", "!$&'()*+,;=", "x.Y.z", "127.0.0.1", ""]
        let ports = [":", ":80", ":8080", ":443", ":8443", ":0", ":65535", ":65536", ":123456", ":8a"]
        let junk = ["%4", "%zz", "@", "user@", "/", "?", "#", " ", "\t", "[", "]", ":", ".", "\u{7f}", "é", "\r", "/x", ""]
        var s = hosts.randomElement(using: &self)!
        if Bool.random(using: &self) { s += ports.randomElement(using: &self)! }
        if Int.random(in: 0..<3, using: &self) == 0 {
            let cut = s.index(s.startIndex, offsetBy: Int.random(in: 0...s.count, using: &self))
            s.insert(contentsOf: junk.randomElement(using: &self)!, at: cut)
        }
        return s
    }
}
