/// Choosing the variant for a request (SPEC §5).
extension PolicyIndex {
    /// The variant to serve, or nil. Candidates are the variants whose pattern matches the URL and whose `when`
    /// covers the situation; an exact pattern beats every glob, and among globs the first in definition order wins.
    /// `CONNECT` tunnels are opaque, so variants never apply to them.
    func variantRewrite(for request: RequestFacts, mode: DataMode, violated: Bool) -> VariantRewrite? {
        if request.isConnect || variants.isEmpty { return nil }
        var cover = WhenMask.always
        if violated { cover |= WhenMask.disallowed }
        if mode.constrained { cover |= WhenMask.constrained }
        if mode.expensive { cover |= WhenMask.expensive }
        if mode.ultraConstrained { cover |= WhenMask.ultraConstrained }
        // In normal mode without a violation only `when: always` variants can apply: usually none, no lookup.
        guard whenBits & cover != 0 else { return nil }

        if !exactVariants.isEmpty, let list = exactVariants[request.url] {
            for i in list where variantWhen[Int(i)] & cover != 0 {
                return rewrite(variants[Int(i)], url: nil)
            }
        }
        if variantsByDirectory.isEmpty && variantsByAuthoritySuffix.isEmpty && variantsByTail.isEmpty
            && otherVariants.isEmpty { return nil }

        let urlText = request.url
        var url = request.url
        return url.withUTF8 { bytes -> VariantRewrite? in
            let best: Int32 = variantGlobs.withView { globs in
                variantWhen.withUnsafeBufferPointer { when in
                    var best = Int32.max
                    if let (authorityStart, authorityEnd) = PolicyIndex.authorityBounds(bytes) {
                        let utf8 = urlText.utf8
                        if !variantsByDirectory.isEmpty {
                            // Each `/`-prefix of the URL whose length some directory key has.
                            var p = authorityEnd
                            let stop = min(bytes.count, variantsByDirectory.maxLength)
                            while p < stop {
                                if bytes[p] == UInt8(ascii: "/"), variantsByDirectory.mayHave(length: p + 1),
                                   let list = variantsByDirectory[urlText[..<utf8.index(utf8.startIndex, offsetBy: p + 1)]] {
                                    best = PolicyIndex.firstHit(list, before: best, when, cover, globs, bytes)
                                }
                                p += 1
                            }
                        }
                        if !variantsByAuthoritySuffix.isEmpty {
                            // Each dot-suffix of the authority.
                            let end = utf8.index(utf8.startIndex, offsetBy: authorityEnd)
                            var p = authorityStart
                            while p < authorityEnd {
                                if bytes[p] == UInt8(ascii: "."),
                                   variantsByAuthoritySuffix.mayHave(length: authorityEnd - p),
                                   let list = variantsByAuthoritySuffix[urlText[utf8.index(utf8.startIndex, offsetBy: p)..<end]] {
                                    best = PolicyIndex.firstHit(list, before: best, when, cover, globs, bytes)
                                }
                                p += 1
                            }
                        }
                    }
                    if !variantsByTail.isEmpty {
                        // Each suffix of the URL as long as some tail key.
                        let utf8 = urlText.utf8
                        for length in variantsByTail.lengths {
                            if length > bytes.count { break }
                            let start = utf8.index(utf8.endIndex, offsetBy: -length)
                            if let list = variantsByTail[urlText[start...]] {
                                best = PolicyIndex.firstHit(list, before: best, when, cover, globs, bytes)
                            }
                        }
                    }
                    best = PolicyIndex.firstHit(otherVariants, before: best, when, cover, globs, bytes)
                    return best
                }
            }
            guard best != Int32.max else { return nil }
            return rewrite(variants[Int(best)], url: bytes)
        }
    }

    /// The first variant of an ascending bucket, below `best`, whose `when` covers and whose glob matches.
    @inline(__always)
    static func firstHit(_ list: [Int32], before best: Int32, _ when: UnsafeBufferPointer<UInt8>, _ cover: UInt8,
                         _ globs: GlobTable.View, _ url: UnsafeBufferPointer<UInt8>) -> Int32 {
        for i in list {
            if i >= best { return best }
            if when[Int(i)] & cover != 0 && globs.matches(i, url) { return i }
        }
        return best
    }

    /// The authority of a request URL as byte offsets: after `scheme://`, up to the first `/`, `?` or `#`.
    static func authorityBounds(_ bytes: UnsafeBufferPointer<UInt8>) -> (Int, Int)? {
        var i = 0
        while i + 2 < bytes.count {
            let c = bytes[i]
            if c == UInt8(ascii: ":") {
                guard bytes[i + 1] == UInt8(ascii: "/"), bytes[i + 2] == UInt8(ascii: "/") else { return nil }
                let start = i + 3
                var end = start
                while end < bytes.count {
                    let c = bytes[end]
                    if c == UInt8(ascii: "/") || c == UInt8(ascii: "?") || c == UInt8(ascii: "#") { break }
                    end += 1
                }
                return (start, end)
            }
            if c == UInt8(ascii: "/") || c == UInt8(ascii: "?") { return nil }
            i += 1
        }
        return nil
    }

    /// The rewrite for a chosen variant; `url` is the request URL's bytes when the pattern is a glob (for `$N`).
    private func rewrite(_ variant: CompiledVariant, url: UnsafeBufferPointer<UInt8>?) -> VariantRewrite {
        switch variant.resource {
        case .file(let path, let contentType):
            return VariantRewrite(id: variant.id, action: .file(path: path, contentType: contentType))
        case .target(let parts, let redirect):
            let target = PolicyIndex.expand(parts, glob: variant.glob, url: url)
            return VariantRewrite(id: variant.id, action: redirect ? .redirect(location: target) : .fetch(url: target))
        }
    }

    /// Substitutes `$N` with the runs the pattern's stars matched.
    static func expand(_ parts: [TargetPart], glob: Glob, url: UnsafeBufferPointer<UInt8>?) -> String {
        var ranges: [Range<Int>] = []
        if let url, parts.contains(where: { if case .capture = $0 { true } else { false } }) {
            ranges = glob.captureRanges(url) ?? []
        }
        var out = ""
        for part in parts {
            switch part {
            case .literal(let text):
                out += text
            case .capture(let k):
                // Validation guarantees k < starCount, so `ranges[k]` exists whenever the glob matched.
                if let url, k < ranges.count {
                    out += String(decoding: UnsafeBufferPointer(rebasing: url[ranges[k]]), as: UTF8.self)
                }
            }
        }
        return out
    }
}
