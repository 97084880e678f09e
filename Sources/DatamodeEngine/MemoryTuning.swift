import CDatamodeShims
#if canImport(Glibc)
import Glibc
#endif

/// How glibc's malloc keeps the memory the relays use, set once at start-up, before any worker thread exists.
///
/// Bodies move through evbuffer chains: a bulk read reserves up to 128 KiB, which libevent rounds up to a 256 KiB
/// chain, and frees it as soon as the bytes are written. With glibc's defaults the top of a worker's arena is
/// trimmed back to the kernel as soon as more than twice the last large block is free there, and taken again on
/// the next read: 6.5 page faults per 100 KiB response, each on the readv that fills the new pages
/// (`perf record -e page-faults`). Keeping up to 8 MiB free at the top, and serving blocks below 4 MiB from the
/// arena instead of mmap(2), took the 100 KiB keep-alive row from 71 to 50 µs of proxy CPU per request; idle
/// memory (bench/run section 3) did not change.
///
/// An operator's `GLIBC_TUNABLES` with any `glibc.malloc.` setting wins: then nothing is set here.
///
/// The thresholds keep the top of each arena; what a burst frees below live blocks is given back by `trim()`, once
/// the proxy has gone quiet (`IdleTrim`).
public enum MemoryTuning {
    public static let mmapThreshold: Int32 = 4 << 20
    public static let trimThreshold: Int32 = 8 << 20

    /// Returns whether the thresholds were set.
    @discardableResult
    public static func apply() -> Bool {
        if let tunables = getenv("GLIBC_TUNABLES"), String(cString: tunables).contains("glibc.malloc.") { return false }
        return dm_malloc_thresholds(mmapThreshold, trimThreshold) == 1
    }

    /// Gives malloc's free memory back to the kernel, from every arena (`malloc_trim(0)`). Returns whether any was.
    @discardableResult
    public static func trim() -> Bool {
        dm_malloc_trim() == 1
    }

    /// The process's resident memory (RSS) in bytes, from /proc/self/statm; nil where unknown.
    public static func residentBytes() -> Int? {
        #if canImport(Glibc)
        let fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { return nil }
        // "size resident shared ...", in pages.
        let fields = buffer[0..<count].split(separator: 0x20)
        guard fields.count > 1, let pages = Int(String(decoding: fields[1], as: UTF8.self)) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
        #else
        return nil
        #endif
    }

    /// The free bytes malloc holds (given back or not); nil where unknown.
    public static func freeBytes() -> Int? {
        let free = dm_malloc_free_bytes()
        return free < 0 ? nil : Int(free)
    }
}
