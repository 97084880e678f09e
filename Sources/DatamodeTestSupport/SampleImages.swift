import Foundation

/// Real JPEG, PNG and WebP images for the transcoding tests (SPEC §13), made by an encoder independent of the
/// proxy's: Debian's Pillow (`python3-pil`, installed by `scripts/bootstrap.sh --test`) under Debian's
/// `/usr/bin/python3`. The picture is photo-like (smooth gradients, shapes and fine noise) so that resizing and
/// re-encoding behave as they do on real photos. A missing Pillow fails the test loudly, never skips it.
public enum SampleImages {
    public enum Kind: String, Sendable {
        case jpeg = "JPEG", png = "PNG", webp = "WEBP"
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Encodes a `width` × `height` image of `kind`; `animated` makes a two-frame WebP or APNG; `alpha` gives
    /// PNG/WebP a transparent corner; `flat` is one colour (tiny as PNG, the case where re-encoding cannot win);
    /// `progressive` writes a progressive JPEG (libjpeg's standard script: 10 scans in colour).
    public static func make(_ kind: Kind, width: Int, height: Int, quality: Int = 90, animated: Bool = false,
                            alpha: Bool = false, flat: Bool = false, progressive: Bool = false,
                            seed: Int = 1) throws -> [UInt8] {
        let script = """
            import io, random, sys
            from PIL import Image, ImageDraw
            kind, w, h, q, animated, alpha, seed, flat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "1", int(sys.argv[7]), sys.argv[8] == "1"
            progressive = sys.argv[9] == "1"
            rnd = random.Random(seed)
            def frame(shift):
                if flat:
                    return Image.new("RGB", (w, h), (200, 120, 40))
                img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
                r = Image.radial_gradient("L").resize((w, h))
                img = Image.merge("RGB", (img.getchannel(0), r, img.getchannel(0).transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
                d = ImageDraw.Draw(img)
                for _ in range(40):
                    x, y = rnd.randrange(w), rnd.randrange(h)
                    s = rnd.randrange(4, max(5, min(w, h) // 4))
                    d.ellipse((x + shift, y, x + s + shift, y + s), fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
                noise = Image.effect_noise((w, h), 24).convert("RGB")
                img = Image.blend(img, noise, 0.12)
                if alpha:
                    img = img.convert("RGBA")
                    ImageDraw.Draw(img).rectangle((0, 0, w // 4, h // 4), fill=(0, 0, 0, 0))
                return img
            out = io.BytesIO()
            if animated:
                frames = [frame(0), frame(w // 10)]
                frames[0].save(out, kind, save_all=True, append_images=frames[1:], duration=100, loop=0, quality=q)
            else:
                frame(0).save(out, kind, quality=q, **({"progressive": True} if progressive else {}))
            sys.stdout.buffer.write(out.getvalue())
            """
        let result = try ExternalCommand.run("/usr/bin/python3", [
            "-c", script, kind.rawValue, String(width), String(height), String(quality), animated ? "1" : "0",
            alpha ? "1" : "0", String(seed), flat ? "1" : "0", progressive ? "1" : "0",
        ])
        guard result.status == 0, !result.stdoutBytes.isEmpty else {
            throw Failure(description: "making a sample \(kind.rawValue) image with /usr/bin/python3 and Pillow failed "
                + "(run scripts/bootstrap.sh --test): \(result.stderr)")
        }
        return result.stdoutBytes
    }
}

extension SampleImages {
    /// A decompression-time bomb (issue 24): a small, valid progressive JPEG (SOF2, one 8-bit grey component) of
    /// `width` × `height` whose `scans` scans each code every block as "end of band" (EOBRUN codes of up to 32,767
    /// blocks). Every scan adds nothing to the picture (mid grey), yet a decoder walks every block of the image once
    /// per scan: a few bytes of input per scan buy a full pass over all the blocks. Written by hand, byte by byte
    /// (ITU T.81 §B, §G.1.2.2), because no encoder writes such a file on purpose (libjpeg's own scan-script check
    /// refuses repeated scans; a decoder only warns about them, as it must accept odd but legal progressions).
    public static func progressiveScanBomb(width: Int, height: Int, scans: Int) -> [UInt8] {
        precondition((1...65535).contains(width) && (1...65535).contains(height) && scans >= 1)
        func be16(_ value: Int) -> [UInt8] { [UInt8(value >> 8), UInt8(value & 0xFF)] }
        var out: [UInt8] = [0xFF, 0xD8]
        // DQT: table 0, 8-bit, all ones.
        out += [0xFF, 0xDB] + be16(67) + [0x00] + [UInt8](repeating: 1, count: 64)
        // SOF2 (progressive, Huffman): 8-bit, height, width, one component (id 1, 1×1 sampling, table 0).
        out += [0xFF, 0xC2] + be16(11) + [8] + be16(height) + be16(width) + [1, 1, 0x11, 0]
        // DHT: AC table 0 with a single 1-bit code ("0") for the symbol 0xE0: EOB14, a run of 2^14 + 14 extra bits.
        out += [0xFF, 0xC4] + be16(20) + [0x10, 1] + [UInt8](repeating: 0, count: 15) + [0xE0]
        // One scan's entropy-coded data: enough EOBRUNs of 32,767 blocks (extra bits all ones) to cover every block.
        let blocks = ((width + 7) / 8) * ((height + 7) / 8)
        let runs = (blocks + 32_766) / 32_767
        var bits: [Bool] = []
        for _ in 0..<runs { bits += [false] + [Bool](repeating: true, count: 14) }
        while bits.count % 8 != 0 { bits.append(true) }  // padding with 1-bits (T.81 §F.1.2.3)
        var data: [UInt8] = []
        for start in stride(from: 0, to: bits.count, by: 8) {
            let byte = bits[start..<(start + 8)].reduce(UInt8(0)) { ($0 << 1) | ($1 ? 1 : 0) }
            data.append(byte)
            if byte == 0xFF { data.append(0x00) }  // byte stuffing (T.81 §F.1.2.3)
        }
        // SOS: one component (id 1, AC table 0), spectral selection 1...63, no successive approximation.
        let scan: [UInt8] = [0xFF, 0xDA] + be16(8) + [1, 1, 0x00, 1, 63, 0x00] + data
        out.reserveCapacity(out.count + scans * scan.count + 2)
        for _ in 0..<scans { out += scan }
        out += [0xFF, 0xD9]
        return out
    }
}
