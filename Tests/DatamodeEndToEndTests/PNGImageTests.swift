import DatamodeTestSupport
import Foundation
import Testing

/// The PNG reader the browser tests use to look at screenshots, and the writer that makes their images.
@Suite struct PNGImageTests {
    /// 32×24 RGB, rows filtered None/Sub/Up/Average/Paeth in turn, compressed by zlib at level 9 (a dynamic
    /// Huffman block): the kinds of data a real encoder writes. Pixel (x, y) = (8x, 10y, 3xy) mod 256.
    static let zlibEncoded = """
        iVBORw0KGgoAAAANSUhEUgAAACAAAAAYCAIAAAAUMWhjAAADNklEQVR42r3VT2hjVRQG8C/2nJLeCW0sU4y2E1IsNoYGwy2W1IZpLDPjs4NDBg\
        YaC2IWV3luJKCMb5lFmckyyMwlKwlaIa6MMxXiRmPdHNBFpqssBsnsshg0yyz8lwbqtFatoil8i3PfXVwuP777AMAPBIEQEAGiQAJIAmnAATJA\
        FsgBLpAHPKAAFIESUAYqQBWoAXWgAQjQBFpAG+gAXaAH+KD6B4wML4/1D4AagRqFGoMKQE1ATUJNQYWgpqHCULNQc1DzUDGoOFQCahFqCWoZKg\
        W1CrUGdRHKgboMdQXqKtQ1qA2oTajXRnAWxKPEfuIx4jPEAeJx4gnix4knic8STxE/QRwifop4mvgccZg4QjxL/DTxHPEzxPPEzxLHiBeI48TP\
        ESeI7xDfpf0bYAQYBcaAwP+XjYNBw68ngjoc0vGITkX15YTeTOq30tpz9M2Mtln9cU7vuPqbvN7z9IOC7hb1ryU9XtbnKnqhqldqer2uX21oV/\
        R7TX2jpW+39XZH3+3q3Z6+50Oqjzw5vJwCchz/QPWDk1Q/Ja4Ra+JF4ueJl4iTxMvEK8eRJ4BJYGrQvOlBZg+Gv8ra3+4a+E04aFIhsxkxXtTY\
        hNlJmr206TpmPGMWsmY9Z1zX3Mibbc/sFky7aH4pmZmyeaFislVzvWZu1c2dhmmK+aFpAi0TaxunY97smq2e+dCHt/vIs8PLKSBfwn/oqt7v6h\
        9UOUX8JfEq8YvEaycihwfIc8A8EDuW1J99vHp0aeG38aDdDNmbEbsTtQ8SdjxpV9LWdeztjN3N2h9zdsa1L+ftdc9+VLDNov25ZGNlu1GxW1X7\
        Wc1+X7dnGjYp9o2mfb9lv2rbhx37ZNde6tl3fP1H3Y/E8HIKyK/jX6oe7uoXB6rnB6pf76vyBeKLxC8RC/H6icjLR5GXB7/URWBpMB+Oc3S5cT\
        AI/JIKiheSnYh0o7KQEDcp22lpOzKTkWxWbuWk6UogL44nWwVpFOWnkiTL8m5FalV5WJNoXUxDKiL3mxJqybW2lDryXVf8Pbngw14feXV4OQVk\
        D4dUPzn6Av+u+vmxrp5/1NVHqs6+Kn9L/ArxFeIM8b3fAHr6Pkj4uGq9AAAAAElFTkSuQmCC
        """

    @Test func aZlibCompressedFilteredImageDecodesToItsPixels() throws {
        let bytes = try #require(Data(base64Encoded: Self.zlibEncoded))
        let image = try PNGImage(decoding: Array(bytes))
        #expect(image.width == 32 && image.height == 24)
        for y in 0..<24 {
            for x in 0..<32 {
                let expected = PNGImage.RGBA(UInt8((8 * x) & 0xFF), UInt8((10 * y) & 0xFF), UInt8((3 * x * y) & 0xFF))
                #expect(image.pixel(x: x, y: y) == expected, "pixel (\(x), \(y))")
            }
        }
    }

    @Test func anEncodedImageDecodesToTheSamePixels() throws {
        // 300×300×4 bytes of rows: more than one 64 KiB stored block.
        let image = PNGImage(width: 300, height: 300, fill: PNGImage.RGBA(1, 2, 3, 4))
        let decoded = try PNGImage(decoding: image.encoded())
        #expect(decoded == image)
    }

    @Test func damagedFilesAreErrorsThatSayWhat() throws {
        let good = PNGImage(width: 4, height: 4, fill: PNGImage.RGBA(9, 9, 9)).encoded()
        #expect(throws: PNGImage.DecodeError.self) { try PNGImage(decoding: Array(good.prefix(40))) }
        var flipped = good
        flipped[45] ^= 0x01   // a byte inside IDAT: its CRC no longer matches
        #expect(throws: PNGImage.DecodeError.self) { try PNGImage(decoding: flipped) }
        #expect(throws: PNGImage.DecodeError.self) { try PNGImage(decoding: Array("GIF89a".utf8)) }
    }
}
