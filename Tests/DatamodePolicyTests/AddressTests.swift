import DatamodePolicy
import Testing

@Suite("IP addresses")
struct IPAddressTests {
    /// (text, canonical description)
    static let valid: [(String, String)] = [
        ("0.0.0.0", "0.0.0.0"),
        ("255.255.255.255", "255.255.255.255"),
        ("192.168.1.1", "192.168.1.1"),
        ("10.0.0.10", "10.0.0.10"),
        ("127.0.0.1", "127.0.0.1"),
        ("::", "::"),
        ("::1", "::1"),
        ("1::", "1::"),
        ("0:0:0:0:0:0:0:0", "::"),
        ("2001:DB8::1", "2001:db8::1"),
        ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),          // first of two equal runs
        ("1:0:0:2:0:0:0:3", "1:0:0:2::3"),                      // the longest run
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),       // one zero group is not compressed
        ("1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0"),
        ("::2:3:4:5:6:7:8", "0:2:3:4:5:6:7:8"),
        ("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"),
        ("fe80::1:2", "fe80::1:2"),
        ("FFFF::", "ffff::"),
        ("::ffff:192.0.2.1", "::ffff:192.0.2.1"),
        ("::ffff:c000:0201", "::ffff:192.0.2.1"),
        ("::FFFF:10.1.2.3", "::ffff:10.1.2.3"),
        ("::192.0.2.1", "::c000:201"),
        ("1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304"),
        ("64:ff9b::192.0.2.33", "64:ff9b::c000:221"),
    ]

    static let invalid: [String] = [
        "", " ", "1.2.3.4 ", " 1.2.3.4", "256.0.0.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.2.3.04", "1.2.3.00",
        "1..2.3", "1.2.3.", ".1.2.3", "+1.2.3.4", "-1.2.3.4", "0x1.2.3.4", "1.2.3.4/8", "1234.1.1.1", "1.2.3.-4",
        "a.b.c.d", "localhost", ":", ":::", "1:::2", "1::2::3", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7",
        "12345::", "g::1", "::1%eth0", "[::1]", "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", ":1::", "1:", ":1",
        "1::2:", "::ffff:1.2.3", "::ffff:256.1.1.1", "::1.2.3.4:5", "::ffff:01.2.3.4", "1:2:3:4:5:6:7:1.2.3.4",
        "::1 ", "1:2:3:4:5:6:7:8:", "::-1",
    ]

    @Test(arguments: valid)
    func parsesAndRendersCanonically(text: String, canonical: String) throws {
        let address = try #require(IPAddress(text))
        #expect(address.description == canonical)
        #expect(IPAddress(canonical) == address, "the canonical form parses back to the same address")
        #expect(address.bytes.count == (text.contains(":") ? 16 : 4))
    }

    @Test(arguments: invalid)
    func refuses(text: String) {
        #expect(IPAddress(text) == nil)
    }

    @Test func bytesAreNetworkOrder() {
        #expect(IPAddress("1.2.3.4")?.bytes == [1, 2, 3, 4])
        #expect(IPAddress("102:304::a0b")?.bytes == [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a, 0x0b])
    }

    @Test(arguments: [
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("::ffff:0.0.0.0", "0.0.0.0"),
        ("::ffff:7f00:1", "127.0.0.1"),
    ])
    func unmapsIPv4MappedAddresses(text: String, v4: String) {
        #expect(IPAddress(text)?.unmappedIPv4 == IPAddress(v4))
    }

    @Test(arguments: ["10.1.2.3", "::1", "::10.1.2.3", "::fffe:10.1.2.3", "1::ffff:10.1.2.3", "64:ff9b::1.2.3.4"])
    func onlyMappedAddressesUnmap(text: String) {
        #expect(IPAddress(text)?.unmappedIPv4 == nil)
    }
}

@Suite("CIDR blocks")
struct CIDRTests {
    @Test(arguments: [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("10.1.2.3/8", "10.0.0.0/8"),           // host bits cleared
        ("192.168.1.200/25", "192.168.1.128/25"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("1.2.3.4", "1.2.3.4/32"),
        ("1.2.3.4/32", "1.2.3.4/32"),
        ("::1/128", "::1/128"),
        ("::1", "::1/128"),
        ("::/0", "::/0"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("2001:db8:ffff::1/33", "2001:db8:8000::/33"),
        ("127.0.0.0/8", "127.0.0.0/8"),
        ("::ffff:0:0/96", "::ffff:0.0.0.0/96"),
    ])
    func parses(text: String, canonical: String) throws {
        let block = try #require(CIDR(text))
        #expect(block.description == canonical)
        #expect(CIDR(canonical) == block)
    }

    @Test(arguments: [
        "", "/8", "10.0.0.0/", "10.0.0.0/33", "::/129", "10.0.0.0/-1", "10.0.0.0/+8", "10.0.0.0/08", "10.0.0.0/8/8",
        "10.0.0.0/ 8", "10.0.0.0 /8", "10.0.0.0/a", "10.0.0.0/1000", "10.0.0/8", "300.0.0.0/8", "[::1]/128", "::1/",
        "localhost/8",
    ])
    func refuses(text: String) {
        #expect(CIDR(text) == nil)
    }

    @Test(arguments: [
        ("10.0.0.0/8", "10.255.0.1", true),
        ("10.0.0.0/8", "10.0.0.0", true),
        ("10.0.0.0/8", "11.0.0.1", false),
        ("10.0.0.0/8", "9.255.255.255", false),
        ("192.168.1.0/25", "192.168.1.127", true),
        ("192.168.1.0/25", "192.168.1.128", false),
        ("0.0.0.0/0", "203.0.113.9", true),
        ("1.2.3.4/32", "1.2.3.4", true),
        ("1.2.3.4/32", "1.2.3.5", false),
        ("10.0.0.0/8", "::ffff:10.1.2.3", true),     // IPv4 client on a dual-stack socket
        ("10.0.0.0/8", "::ffff:11.1.2.3", false),
        ("127.0.0.0/8", "::1", false),
        ("0.0.0.0/0", "::1", false),
        ("::1/128", "::1", true),
        ("::1/128", "::2", false),
        ("::1/128", "127.0.0.1", false),
        ("::/0", "2001:db8::1", true),
        ("::ffff:0:0/96", "10.0.0.1", true),          // IPv4 client against an IPv6-mapped block
        ("2001:db8::/33", "2001:db8:7fff::1", true),
        ("2001:db8::/33", "2001:db8:8000::1", false),
        ("2001:db8::/32", "2001:db9::", false),
    ])
    func contains(block: String, address: String, expected: Bool) throws {
        let cidr = try #require(CIDR(block))
        let ip = try #require(IPAddress(address))
        #expect(cidr.contains(ip) == expected)
    }
}
