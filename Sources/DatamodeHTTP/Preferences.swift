/// What a request's `Prefer` fields ask for (RFC 7240), as far as the proxy acts on it (SPEC §18): `wait=N`
/// (hold a refused request up to N seconds for its conditions to lift) and `respond-async` (store a refused
/// upload and answer `202`).
///
/// RFC 7240 §2: `Prefer = 1#preference`, `preference = token [ BWS "=" BWS word ] *( OWS ";" [ OWS parameter ] )`;
/// names are case-insensitive, a value may be a quoted string, and of a preference given more than once only
/// the first counts. A preference the proxy does not understand, or a malformed value, is ignored (§2: a
/// preference is never a reason to fail a request).
public struct Preferences: Equatable, Sendable {
    /// `wait=N`: delta-seconds (RFC 9110 §1.2.4 grammar: digits only); nil when absent or malformed.
    public var wait: Int64?
    /// `respond-async` is present.
    public var respondAsync = false

    public init(wait: Int64? = nil, respondAsync: Bool = false) {
        self.wait = wait
        self.respondAsync = respondAsync
    }

    /// The most seconds a `wait` keeps: beyond it the value is taken as this (no hold is that long anyway).
    public static let maximumWait: Int64 = 1 << 31

    /// Reads every `Prefer` field value, in order.
    public static func parse(_ values: [String]) -> Preferences {
        var preferences = Preferences()
        var sawWait = false
        for value in values {
            for preference in splitOutsideQuotes(value, separator: ",") {
                // The preference itself is before the first ";" (its parameters after it are ignored).
                guard let first = splitOutsideQuotes(preference, separator: ";").first else { continue }
                let pair = first.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = pair[0].trimmingOWS().lowercased()
                switch name {
                case "respond-async":
                    preferences.respondAsync = true
                case "wait":
                    guard !sawWait else { continue }
                    sawWait = true
                    guard pair.count == 2 else { continue }
                    var word = Substring(pair[1].trimmingOWS())
                    if word.count >= 2, word.first == "\"", word.last == "\"" { word = word.dropFirst().dropLast() }
                    guard !word.isEmpty, word.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
                    else { continue }
                    preferences.wait = word.utf8.count > 10 ? maximumWait : min(Int64(word)!, maximumWait)
                default:
                    continue
                }
            }
        }
        return preferences
    }

    /// Splits at `separator` outside quoted strings (a `\` inside one escapes the next character). Also how
    /// `Alt-Svc` is split into its alt-values (`AltSvc`): one reading of a quoted list for every field.
    public static func splitOutsideQuotes(_ text: String, separator: Character) -> [String] {
        var parts: [String] = []
        var current = ""
        var quoted = false
        var escaped = false
        for character in text {
            if escaped {
                escaped = false
            } else if quoted && character == "\\" {
                escaped = true
            } else if character == "\"" {
                quoted.toggle()
            } else if character == separator && !quoted {
                parts.append(current)
                current = ""
                continue
            }
            current.append(character)
        }
        parts.append(current)
        return parts
    }
}

fileprivate extension StringProtocol {
    /// Without leading and trailing spaces and tabs (OWS, RFC 9110 §5.6.3).
    func trimmingOWS() -> String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
