import CDatamodeShims
import CLibevent
@testable import DatamodeEngine
import Testing

/// libevent's allocator with the per-thread cache of evbuffer chains (`dm_event_use_chain_cache`, issue 31): a freed
/// chain of a cached size is reused by the next chain of that size on the same thread, the cache never holds more
/// than its bound, and every other block is plain malloc. (The whole suite runs on it: every engine test allocates
/// its buffers through it.) Synchronous on purpose: the cache is the calling thread's.
@Suite struct ChainCacheTests {
    init() { _ = ProxyServerProcess.setUp }

    /// One evbuffer with `count` bytes in one chain, freed: its chain goes to this thread's cache (or to malloc).
    private func churn(_ count: Int) {
        let buffer = evbuffer_new()!
        let bytes = [UInt8](repeating: 0x61, count: count)
        evbuffer_add(buffer, bytes, count)
        #expect(evbuffer_get_length(buffer) == count)
        evbuffer_free(buffer)
    }

    @Test func aFreedChainIsReusedByTheNextOfItsSize() {
        dm_event_chain_cache_drain()
        #expect(dm_event_chain_cache_bytes() == 0)
        churn(100)  // a 1 KiB chain (libevent's smallest)
        #expect(dm_event_chain_cache_bytes() == 1024)
        let buffer = evbuffer_new()!
        evbuffer_add(buffer, [UInt8](repeating: 0x62, count: 200), 200)  // takes the cached chain
        #expect(dm_event_chain_cache_bytes() == 0)
        var out = [UInt8](repeating: 0, count: 200)
        #expect(evbuffer_remove(buffer, &out, 200) == 200)
        #expect(out.allSatisfy { $0 == 0x62 })
        evbuffer_free(buffer)
        churn(1500)  // 2 KiB
        churn(3000)  // 4 KiB
        #expect(dm_event_chain_cache_bytes() == 1024 + 2048 + 4096)
        dm_event_chain_cache_drain()
        #expect(dm_event_chain_cache_bytes() == 0)
    }

    @Test func theCacheIsBoundedAndOtherSizesAreNotKept() {
        dm_event_chain_cache_drain()
        // Many chains live at once, then freed together: at most 32 + 16 + 8 are kept (96 KiB).
        for count in [100, 1500, 3000] {
            let buffers = (0..<100).map { _ in evbuffer_new()! }
            for buffer in buffers { evbuffer_add(buffer, [UInt8](repeating: 0x63, count: count), count) }
            for buffer in buffers { evbuffer_free(buffer) }
        }
        #expect(dm_event_chain_cache_bytes() == 32 * 1024 + 16 * 2048 + 8 * 4096)
        dm_event_chain_cache_drain()
        churn(10_000)  // a 16 KiB chain: plain malloc and free
        #expect(dm_event_chain_cache_bytes() == 0)
    }
}
