import DatamodeTestSupport
import Foundation
import Testing

/// Relayed bodies live in evbuffer chains of up to 256 KiB that are freed as soon as they are written. With glibc's
/// default thresholds the top of a worker's arena went back to the kernel and was faulted in again on the next
/// read (6.5 page faults per 100 KiB response under bench/run's 50 connections, a third of the proxy's CPU in its
/// 100 KiB row). The proxy sets malloc's thresholds at start-up, unless the operator's `GLIBC_TUNABLES` sets malloc's
/// own. The effect is measured by bench/run (faults and CPU are not asserted here); this pins down the switch.
@Suite struct MemoryTuningEndToEndTests {
    @Test func theRunningProxySetsMallocThresholds() throws {
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        #expect(proxy.stderr.contains("malloc thresholds set for relay buffers"))
        #expect(proxy.stderr.contains("trim_threshold=8388608"))
    }

    @Test func anOperatorsGlibcMallocTunablesWin() throws {
        let proxy = try ProxyProcess(config: "", environment: ["GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"])
        defer { proxy.stop() }
        #expect(proxy.stderr.contains("malloc thresholds left as GLIBC_TUNABLES sets them"))
        #expect(!proxy.stderr.contains("malloc thresholds set"))
    }
}
