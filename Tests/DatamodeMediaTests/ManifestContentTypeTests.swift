@testable import DatamodeMedia
import DatamodeTestSupport
import Testing

@Suite("Content-Type classification for manifest capping")
struct ManifestContentTypeTests {
    /// The classification as SPEC §13 states it, written the obvious way (split, filter, lowercase, set lookup):
    /// the in-place byte classifier must agree with it on every value.
    static func reference(_ value: String?) -> ManifestContentType {
        guard let value else { return .generic }
        let essence = value.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        let type = String(essence.filter { $0 != " " && $0 != "\t" }).lowercased()
        if ManifestContentType.manifestTypes.contains(type) { return .manifest }
        if ManifestContentType.genericTypes.contains(type) { return .generic }
        return .other
    }

    @Test("known values", arguments: [
        ("application/vnd.apple.mpegurl", ManifestContentType.manifest),
        ("Application/VND.Apple.MPEGURL; charset=utf-8", .manifest),
        ("  application/dash+xml ;profile=x", .manifest),
        ("video/vnd.mpeg.dash.mpd", .manifest),
        ("audio/x-mpegurl\t", .manifest),
        ("application/octet-stream", .generic),
        ("TEXT/PLAIN;charset=us-ascii", .generic),
        ("text / xml", .generic),
        ("", .other),
        (";", .other),
        ("video/mp4", .other),
        ("image/jpeg", .other),
        ("application/vnd.apple.mpegurl-but-longer-than-any-known-type", .other),
        ("application/octet-streamx", .other),
        ("application/octet-strea", .other),
        ("ä/ö", .other),
    ])
    func knownValues(value: String, expected: ManifestContentType) {
        #expect(ManifestContentType(value) == expected)
        #expect(Self.reference(value) == expected)
    }

    @Test("no Content-Type is generic")
    func absent() {
        #expect(ManifestContentType(nil) == .generic)
    }

    @Test("agrees with the reference on mutations of every known type (case, spaces, parameters, cuts, extra bytes)")
    func agreesWithReference() {
        var generator = SeededGenerator(seed: 0x6d61_6e69)
        let alphabet = Array("aAzZ/+-.;; \t\u{e4}ATVXML".unicodeScalars)
        let seeds = Array(ManifestContentType.manifestTypes) + Array(ManifestContentType.genericTypes) + ["video/mp4"]
        for _ in 0..<20_000 {
            var scalars = Array(seeds.randomElement(using: &generator)!.unicodeScalars)
            for _ in 0..<Int.random(in: 0...3, using: &generator) {
                let position = Int.random(in: 0...scalars.count, using: &generator)
                switch Int.random(in: 0..<4, using: &generator) {
                case 0: scalars.insert(alphabet.randomElement(using: &generator)!, at: position)
                case 1 where position < scalars.count: scalars.remove(at: position)
                case 2 where position < scalars.count:
                    scalars[position] = Unicode.Scalar(String(scalars[position]).uppercased().unicodeScalars.first!.value)!
                default: scalars.insert(" ", at: position)
                }
            }
            var value = ""
            value.unicodeScalars.append(contentsOf: scalars)
            #expect(ManifestContentType(value) == Self.reference(value), "\(value.debugDescription)")
        }
    }
}
