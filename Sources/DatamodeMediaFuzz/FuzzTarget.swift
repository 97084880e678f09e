/// libFuzzer entry point for DatamodeMedia (the HLS/DASH manifest cap). libFuzzer provides `main`.
///
/// Build and run: see README "Fuzzing" (DATAMODE_FUZZ=1 … --product DatamodeMediaFuzz). Besides "never crash,
/// never read out of bounds" (ASan), each input checks the properties the proxy relies on:
/// - a rewrite only cuts: the output is a subsequence of the input, shorter, and still a manifest of the same kind;
/// - a rewrite is idempotent: capping the output again with the same cap changes nothing;
/// - sniffing never calls a manifest "not a manifest" from a prefix (the engine would stream it unrewritten);
/// - the verdict does not depend on the cap for "not a manifest" / "malformed".
import DatamodeMedia

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    guard size >= 1 else { return 0 }
    // The first byte picks the cap, so that every rung of a ladder is exercised.
    let caps: [UInt64] = [1, 64_000, 145_000, 730_000, 2_000_000, 10_000_000_000]
    let cap = caps[Int(data[0]) % caps.count]
    let body = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let result = ManifestCap.rewrite(body, cap: cap)
    switch result {
    case .rewritten(let kind, let out, let removed):
        guard removed > 0, out.count < body.count else { fatalError("a rewrite that removed nothing") }
        guard isSubsequence(out, of: body) else { fatalError("a rewrite added or changed bytes") }
        guard ManifestCap.rewrite(out, cap: cap) == .unchanged(kind) else {
            fatalError("not idempotent: \(ManifestCap.rewrite(out, cap: cap))")
        }
    case .unchanged, .notAManifest, .malformed:
        break
    }
    let otherCap = caps[(Int(data[0]) + 1) % caps.count]
    switch (result, ManifestCap.rewrite(body, cap: otherCap)) {
    case (.notAManifest, .notAManifest), (.malformed, .malformed): break
    case (.notAManifest, _), (.malformed, _), (_, .notAManifest), (_, .malformed):
        fatalError("the verdict depends on the cap")
    default: break
    }
    if case .rewritten = result {
        checkSniff(body)
    } else if case .unchanged = result {
        checkSniff(body)
    }
    return 0
}

private func checkSniff(_ body: [UInt8]) {
    for length in [0, 1, 7, 8, 16, body.count / 2, body.count] where length <= body.count {
        let complete = length == body.count
        if ManifestCap.sniff(Array(body[0..<length]), complete: complete) == .notAManifest {
            fatalError("a manifest sniffed as not one from its first \(length) bytes")
        }
    }
}

private func isSubsequence(_ small: [UInt8], of big: [UInt8]) -> Bool {
    var i = 0
    for byte in big where i < small.count && small[i] == byte { i += 1 }
    return i == small.count
}
