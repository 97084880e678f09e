/// A segment of an admin path (`/variants/{id}`, `/deferred/{id}`) as the client sent it, percent-encoded.
enum AdminPathSegment {
    /// `segment` as received, in quotes, for a refusal: printable ASCII as it is (percent escapes stay escapes),
    /// every other byte and `"` and `\` percent-encoded, so nothing the client sent is decoded into the answer.
    static func quoted(_ segment: String) -> String {
        var out = "\""
        for b in segment.utf8 {
            if b > 0x20 && b < 0x7F && b != UInt8(ascii: "\"") && b != UInt8(ascii: "\\") {
                out.unicodeScalars.append(Unicode.Scalar(b))
            } else {
                out += (b < 0x10 ? "%0" : "%") + String(b, radix: 16, uppercase: true)
            }
        }
        return out + "\""
    }
}
