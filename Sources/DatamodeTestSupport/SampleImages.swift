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
    /// PNG/WebP a transparent corner; `flat` is one colour (tiny as PNG, the case where re-encoding cannot win).
    public static func make(_ kind: Kind, width: Int, height: Int, quality: Int = 90, animated: Bool = false,
                            alpha: Bool = false, flat: Bool = false, seed: Int = 1) throws -> [UInt8] {
        let script = """
            import io, random, sys
            from PIL import Image, ImageDraw
            kind, w, h, q, animated, alpha, seed, flat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "1", int(sys.argv[7]), sys.argv[8] == "1"
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
                frame(0).save(out, kind, quality=q)
            sys.stdout.buffer.write(out.getvalue())
            """
        let result = try ExternalCommand.run("/usr/bin/python3", [
            "-c", script, kind.rawValue, String(width), String(height), String(quality), animated ? "1" : "0",
            alpha ? "1" : "0", String(seed), flat ? "1" : "0",
        ])
        guard result.status == 0, !result.stdoutBytes.isEmpty else {
            throw Failure(description: "making a sample \(kind.rawValue) image with /usr/bin/python3 and Pillow failed "
                + "(run scripts/bootstrap.sh --test): \(result.stderr)")
        }
        return result.stdoutBytes
    }
}
