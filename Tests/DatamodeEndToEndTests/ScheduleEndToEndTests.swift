// SPEC §12 schedules through the real binary: a timeline's steps reach GET /mode and the event stream at their
// times, with source "schedule", and a PUT /mode cancels it. The exact timing is tested on the injected clock
// (DatamodeAdminTests); here the lateness on a real, loaded machine is asserted generously and printed.
import DatamodeTestSupport
import Foundation
import Testing

@Suite("Schedules: end to end", .serialized)
struct ScheduleEndToEndTests {
    @Test("a two-step timeline runs on time, is emitted as events, and PUT /mode cancels its repeat")
    func timeline() throws {
        try withAdminProxy { proxy, admin in
            let stream = try EventStreamClient(port: proxy.adminPort)
            defer { stream.close() }
            _ = try stream.next("mode")
            let start = Date()
            let body = #"{"steps": [{"after": "300ms", "mode": "constrained"}, {"after": "300ms", "mode": "normal"}], "repeat": true}"#
            #expect(try admin.put("/schedule", body).status == 200)
            let first = try stream.next("mode")
            let firstAt = Date().timeIntervalSince(start)
            #expect(first.object["mode"] as? String == "constrained")
            #expect(first.object["source"] as? String == "schedule")
            let second = try stream.next("mode")
            let secondAt = Date().timeIntervalSince(start)
            #expect(second.object["mode"] as? String == "normal")
            print("schedule: steps seen at \(Int(firstAt * 1000)) ms and \(Int(secondAt * 1000)) ms (nominal 300, 600)")
            #expect(firstAt >= 0.29 && firstAt < 1.3, "the first step within a generous margin of 300 ms")
            #expect(secondAt >= 0.59 && secondAt < 1.6)
            let listed = try admin.get("/schedule").object["schedules"] as? [[String: Any]] ?? []
            #expect(listed.count == 1, "a repeating timeline goes on")
            #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
            #expect((try admin.get("/schedule").object["schedules"] as? [Any])?.isEmpty == true)
            Thread.sleep(forTimeInterval: 0.8)
            let mode = try admin.get("/mode").object
            #expect(mode["mode"] as? String == "expensive" && mode["source"] as? String == "api", "no step after the cancel")
        }
    }
}
