/// Text form and membership of `CIDR` blocks (access control, rule `client` criteria).
extension CIDR {
    /// Parses `address/prefix` (`10.0.0.0/8`, `::1/128`) or a bare address (a full-length block).
    ///
    /// The prefix is decimal without sign or leading zeros, at most 32 for IPv4 and 128 for IPv6.
    /// Host bits set after the prefix (`10.1.2.3/8`) are accepted and cleared, as Squid and Envoy do,
    /// so `description` shows the block actually matched (`10.0.0.0/8`).
    public init?(_ text: String) {
        let address: Substring
        var prefix: Int? = nil
        if let slash = text.firstIndex(of: "/") {
            address = text[..<slash]
            let digits = text[text.index(after: slash)...]
            guard !digits.isEmpty, digits.count <= 3,
                  digits.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                  digits == "0" || digits.first != "0",
                  let value = Int(digits) else { return nil }
            prefix = value
        } else {
            address = text[...]
        }
        guard let network = IPAddress(String(address)) else { return nil }
        let maxLength = network.bytes.count * 8
        let length = prefix ?? maxLength
        guard length >= 0, length <= maxLength else { return nil }
        self.init(network: CIDR.masked(network, to: length), prefixLength: length)
    }

    /// Whether `address` lies in this block. An IPv4-mapped IPv6 address (`::ffff:10.1.2.3`, what a dual-stack
    /// socket reports for an IPv4 client) is compared as the IPv4 address it carries, and an IPv4 address
    /// against an IPv6 block as its mapped form, so one access list works on either kind of listener.
    public func contains(_ address: IPAddress) -> Bool {
        let networkBytes = network.bytes
        let length = prefixLength
        if networkBytes.count == address.bytes.count {
            return CIDR.prefixEqual(networkBytes, address.bytes, length)
        }
        if networkBytes.count == 4 {
            guard let v4 = address.unmappedIPv4 else { return false }
            return CIDR.prefixEqual(networkBytes, v4.bytes, length)
        }
        // An IPv6 block and an IPv4 address: compare the mapped form ::ffff:a.b.c.d.
        var mapped = [UInt8](repeating: 0, count: 16)
        mapped[10] = 0xff
        mapped[11] = 0xff
        for i in 0..<4 { mapped[12 + i] = address.bytes[i] }
        return CIDR.prefixEqual(networkBytes, mapped, length)
    }

    /// `network/prefixLength`, the network in canonical text (`10.0.0.0/8`, `::1/128`).
    public var description: String { "\(network)/\(prefixLength)" }

    static func prefixEqual(_ a: [UInt8], _ b: [UInt8], _ length: Int) -> Bool {
        let fullBytes = length / 8
        for i in 0..<fullBytes where a[i] != b[i] { return false }
        let remaining = length % 8
        if remaining == 0 { return true }
        let mask = UInt8(truncatingIfNeeded: 0xff << (8 - remaining))
        return a[fullBytes] & mask == b[fullBytes] & mask
    }

    static func masked(_ address: IPAddress, to length: Int) -> IPAddress {
        var bytes = address.bytes
        for i in 0..<bytes.count {
            let bitsBefore = i * 8
            if bitsBefore >= length {
                bytes[i] = 0
            } else if length - bitsBefore < 8 {
                bytes[i] &= UInt8(truncatingIfNeeded: 0xff << (8 - (length - bitsBefore)))
            }
        }
        return IPAddress(bytes: bytes)!
    }
}
