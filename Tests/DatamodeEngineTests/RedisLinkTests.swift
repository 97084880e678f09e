import DatamodeEngine
import DatamodeTestSupport
import Foundation
import Logging
import Synchronization
import Testing

/// `RedisLink` (SPEC §19) against a real redis-server: commands, the subscription, AUTH, and a Redis killed and
/// started again.
@Suite("RedisLink: hiredis on its own libevent base", .serialized)
struct RedisLinkTests {
    final class Inbox: Sendable {
        let messages = Mutex<[String]>([])
        let ups = Atomic<Int>(0)
        let downs = Atomic<Int>(0)
    }

    static func link(_ redis: RedisServer, password: String?, inbox: Inbox) throws -> RedisLink {
        let link = try RedisLink(endpoint: RedisEndpoint(host: "127.0.0.1", port: Int(redis.port), database: 3, password: password),
                                 channel: "test:changes", logger: Logger(label: "redis-test") { _ in SwiftLogNoOpLogHandler() }) { payload in
            inbox.messages.withLock { $0.append(String(decoding: payload, as: UTF8.self)) }
        }
        link.onUp = { inbox.ups.add(1, ordering: .relaxed) }
        link.onDown = { inbox.downs.add(1, ordering: .relaxed) }
        return link
    }

    /// Sends `arguments` and waits for the reply (nil: none within 5 s, or the link dropped it).
    static func call(_ link: RedisLink, _ arguments: [String]) -> RedisReply? {
        let result = Mutex<RedisReply??>(nil)
        link.command(arguments.map { Array($0.utf8) }) { reply in result.withLock { $0 = .some(reply) } }
        AdminPolling.until(timeout: .seconds(5), interval: .milliseconds(2)) { result.withLock { $0 != nil } }
        return result.withLock { $0 ?? nil }
    }

    @Test("With a password: commands in the selected database, binary-safe values, and messages of the channel")
    func commandsAndMessages() throws {
        let redis = try RedisServer(password: "s3cret pass")
        let inbox = Inbox()
        let link = try Self.link(redis, password: "s3cret pass", inbox: inbox)
        link.start()
        defer { link.stop() }
        #expect(AdminPolling.until(timeout: .seconds(5)) { link.isUp }, "never up: \(redis.log)")
        #expect(AdminPolling.until(timeout: .seconds(5)) { inbox.ups.load(ordering: .relaxed) >= 1 })
        #expect(inbox.ups.load(ordering: .relaxed) == 1)
        #expect(Self.call(link, ["SET", "k", "a\u{0}b c"]) == .status("OK"))
        #expect(Self.call(link, ["GET", "k"]) == .string(Array("a\u{0}b c".utf8)))
        #expect(Self.call(link, ["INCRBY", "n", "40"]) == .integer(40))
        #expect(Self.call(link, ["GET", "missing"]) == .null)
        if case .error(let text)? = Self.call(link, ["INCRBY", "k", "1"]) { #expect(text.contains("not an integer")) } else {
            Issue.record("INCRBY of a string is an error reply")
        }
        #expect(try redis.command(["-n", "3", "GET", "n"]) == "40", "SELECT 3 took effect")
        _ = try redis.command(["PUBLISH", "test:changes", "mode"])
        #expect(AdminPolling.until(timeout: .seconds(5)) { inbox.messages.withLock { $0 } == ["mode"] })
    }

    @Test("A wrong password: never up, and commands complete with nil rather than wait")
    func wrongPassword() throws {
        let redis = try RedisServer(password: "right")
        let inbox = Inbox()
        let link = try Self.link(redis, password: "wrong", inbox: inbox)
        link.start()
        defer { link.stop() }
        Thread.sleep(forTimeInterval: 0.5)
        #expect(!link.isUp && inbox.ups.load(ordering: .relaxed) == 0)
    }

    @Test("Redis killed: the link goes down, commands complete with nil; started again: up again, subscribed again")
    func killedAndRestarted() throws {
        let redis = try RedisServer()
        let inbox = Inbox()
        let link = try Self.link(redis, password: nil, inbox: inbox)
        link.start()
        defer { link.stop() }
        #expect(AdminPolling.until(timeout: .seconds(5)) { link.isUp })
        redis.kill()
        #expect(AdminPolling.until(timeout: .seconds(5)) { !link.isUp })
        // `isUp` turns before the callback runs (the link logs in between): wait for the callback, then count it.
        #expect(AdminPolling.until(timeout: .seconds(5)) { inbox.downs.load(ordering: .relaxed) >= 1 })
        #expect(inbox.downs.load(ordering: .relaxed) == 1)
        #expect(Self.call(link, ["PING"]) == nil)
        try redis.start()
        #expect(AdminPolling.until(timeout: .seconds(10)) { link.isUp }, "not up again")
        #expect(AdminPolling.until(timeout: .seconds(5)) { inbox.ups.load(ordering: .relaxed) >= 2 })
        #expect(inbox.ups.load(ordering: .relaxed) == 2)
        #expect(Self.call(link, ["PING"]) == .status("PONG"))
        _ = try redis.command(["PUBLISH", "test:changes", "again"])
        #expect(AdminPolling.until(timeout: .seconds(5)) { inbox.messages.withLock { $0 } == ["again"] })
    }

    @Test("A Redis that stops answering (SIGSTOP): the command's completion gets nil after the reply deadline, the link goes down, and comes back when Redis does")
    func stalled() throws {
        let redis = try RedisServer()
        let inbox = Inbox()
        let link = try Self.link(redis, password: nil, inbox: inbox)
        link.start()
        defer { link.stop() }
        #expect(AdminPolling.until(timeout: .seconds(5)) { link.isUp })
        redis.pause()
        defer { redis.resume() }
        let started = ContinuousClock.now
        #expect(Self.call(link, ["PING"]) == nil, "no reply from a frozen Redis")
        let waited = ContinuousClock.now - started
        #expect(waited < .seconds(4), "the completion came after the 1 s deadline, not never: \(waited)")
        #expect(AdminPolling.until(timeout: .seconds(3)) { !link.isUp })
        redis.resume()
        #expect(AdminPolling.until(timeout: .seconds(10)) { link.isUp }, "not up again after SIGCONT")
        #expect(Self.call(link, ["PING"]) == .status("PONG"))
    }
}
