/// libFuzzer entry point for the C image layer (CDatamodeImage): header probing and decode/resize/encode of
/// untrusted bytes. libFuzzer provides `main`. Build and run: README "Fuzzing" (`--product DatamodeImageFuzz`).
/// Checks, besides ASan's: a probe never reports a zero size, and an image within a small pixel budget either
/// transcodes to a non-empty output or fails cleanly (no crash, no leak).
import CDatamodeImage

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    var info = dm_image_info()
    guard dm_image_probe(data, size, &info) == 0 else { return 0 }
    guard info.width > 0, info.height > 0 else { fatalError("probe reported a zero size") }
    // Decode only what a small max-pixels would let through, as the proxy does.
    guard UInt64(info.width) * UInt64(info.height) <= 1 << 20, info.animated == 0 else { return 0 }
    // The proxy's limits (ImageLimits.standard): 100 scans, 2 s of CPU.
    var limits = dm_image_limits(max_scans: 100, cpu_budget_ns: 2_000_000_000)
    for format in [Int32(1), 2, 3] {
        var out: UnsafeMutablePointer<UInt8>?
        var length = 0
        if dm_image_transcode(data, size, &info, 64, 50, format, &limits, &out, &length) == 0 {
            guard let out, length > 0 else { fatalError("success without output") }
            dm_image_free(out)
        }
    }
    return 0
}
