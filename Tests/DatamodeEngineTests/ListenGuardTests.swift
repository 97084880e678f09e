import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

/// SPEC §6: two proxies never share a port by accident, not even two started at the same moment (both would
/// pass a probe of the address before either listens, and SO_REUSEPORT would then let both in).
@Suite struct ListenGuardTests {
    @Test func twoProxiesStartingAtOnceOnOnePortNeverBothListen() throws {
        for _ in 0..<10 {
            let port = try LoopbackPort.refusingConnections()
            let started = Mutex<[ProxyHarness]>([])
            let failures = Mutex<[String]>([])
            DispatchQueue.concurrentPerform(iterations: 2) { _ in
                do {
                    let proxy = try ProxyHarness(listenPort: port)
                    started.withLock { $0.append(proxy) }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
            let proxies = started.withLock { $0 }
            defer { for proxy in proxies { proxy.stop() } }
            #expect(proxies.count == 1, "port \(port): \(proxies.count) proxies started")
            let messages = failures.withLock { $0 }
            #expect(messages.count == 1 && messages.allSatisfy { $0.contains("127.0.0.1:\(port)") }, "\(messages)")
        }
    }
}
