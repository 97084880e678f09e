import DatamodeHTTP

/// `Alt-Svc` (RFC 7838) without its HTTP/3 alternatives, for responses on the transparent listener (SPEC §16): a
/// browser told `h3=":443"` moves to QUIC over UDP, which no TCP redirect catches, and would leave the data mode
/// behind. Entries whose protocol-id is `h3` or `h3-*` (drafts) are dropped; the others, and `clear`, are kept as
/// written; a field left empty is removed.
enum AltSvc {
    static func withoutHTTP3(_ head: ResponseHead) -> ResponseHead {
        guard head.fields.contains(where: { $0.name.utf8.count == 7 && $0.name.lowercased() == "alt-svc" }) else { return head }
        var head = head
        head.fields = head.fields.compactMap { field in
            guard field.name.lowercased() == "alt-svc" else { return field }
            guard let kept = withoutHTTP3(field.value) else { return nil }
            var field = field
            field.value = kept
            return field
        }
        return head
    }

    /// The field value without its HTTP/3 entries; nil when none is left.
    static func withoutHTTP3(_ value: String) -> String? {
        let kept = entries(value).filter { entry in
            let protocolID = entry.prefix { $0 != "=" }.trimmingSpaces
            return !(protocolID == "h3" || protocolID.hasPrefix("h3-"))
        }
        return kept.isEmpty ? nil : kept.joined(separator: ", ")
    }

    /// The comma-separated alt-values, trimmed, commas inside quoted strings (the alt-authority) kept.
    static func entries(_ value: String) -> [String] {
        Preferences.splitOutsideQuotes(value, separator: ",").map(\.trimmingSpaces).filter { !$0.isEmpty }
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs (OWS, RFC 9110 §5.6.3).
    fileprivate var trimmingSpaces: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = firstIndex(where: { !isSpace($0) }), let last = lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(self[first...last])
    }
}
