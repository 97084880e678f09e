import DatamodeAdmin
import DatamodePolicy
import DatamodeState
import Testing

/// `GET /metrics`: Prometheus text format 0.0.4 (SPEC §7).
@Suite("Admin: /metrics")
struct MetricsEndpointTests {
    static func lines(_ admin: AdminFixture) -> [String] {
        admin.handle("GET", "/metrics").text.split(separator: "\n").map(String.init)
    }

    @Test("an idle process: every series present at 0, the mode and the variants from the runtime")
    func idle() throws {
        let admin = try AdminFixture("""
            mode: constrained
            variants:
              - {id: cfg, match: "http://a.example/*", target: "http://b.example/$1"}
            """)
        let response = admin.handle("GET", "/metrics")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "text/plain; version=0.0.4; charset=utf-8")
        let lines = Self.lines(admin)
        for expected in [
            #"datamode_requests_total{outcome="forwarded",reason=""} 0"#,
            #"datamode_requests_total{outcome="rewritten",reason=""} 0"#,
            #"datamode_requests_total{outcome="rejected",reason=""} 0"#,
            #"datamode_requests_total{outcome="error",reason=""} 0"#,
            #"datamode_bytes_total{direction="in"} 0"#,
            #"datamode_bytes_total{direction="out"} 0"#,
            "datamode_connections_active 0",
            "datamode_tunnel_splices_total 0",
            "datamode_log_dropped_total 0",
            #"datamode_mode{condition="constrained"} 1"#,
            #"datamode_mode{condition="expensive"} 0"#,
            #"datamode_variants{source="config"} 1"#,
            #"datamode_variants{source="api"} 0"#,
            #"datamode_reloads_total{result="ok"} 0"#,
            #"datamode_reloads_total{result="failed"} 0"#,
            #"datamode_request_duration_seconds_bucket{le="+Inf"} 0"#,
            "datamode_request_duration_seconds_count 0",
        ] {
            #expect(lines.contains(expected), "missing \(expected)")
        }
    }

    @Test("every series has one HELP and one TYPE line, before its samples")
    func metadata() throws {
        let lines = Self.lines(try AdminFixture())
        var described: Set<String> = []
        for line in lines {
            if line.hasPrefix("# HELP ") {
                let name = String(line.dropFirst(7).prefix { $0 != " " })
                #expect(!described.contains(name), "two HELP lines for \(name)")
                described.insert(name)
                continue
            }
            if line.hasPrefix("# TYPE ") { continue }
            let name = String(line.prefix { $0 != "{" && $0 != " " })
            let family = ["_bucket", "_sum", "_count"].reduce(name) { family, suffix in
                family.hasSuffix(suffix) && described.contains(String(family.dropLast(suffix.count)))
                    ? String(family.dropLast(suffix.count)) : family
            }
            #expect(described.contains(family), "\(line) has no HELP before it")
        }
    }

    @Test("the workers' counters, summed, are rendered as given", arguments: [
        (RequestLabel(outcome: "forwarded", reason: ""), 3, #"datamode_requests_total{outcome="forwarded",reason=""} 3"#),
        (RequestLabel(outcome: "rejected", reason: "constrained"), 2, #"datamode_requests_total{outcome="rejected",reason="constrained"} 2"#),
        (RequestLabel(outcome: "error", reason: "upstream-timeout"), 1, #"datamode_requests_total{outcome="error",reason="upstream-timeout"} 1"#),
    ])
    func requests(_ label: RequestLabel, _ count: Int, _ line: String) throws {
        let admin = try AdminFixture()
        var metrics = MetricsSnapshot()
        metrics.requests[label] = count
        admin.metrics.value = metrics
        let lines = Self.lines(admin)
        #expect(lines.contains(line), "\(lines)")
        // An outcome with a count keeps no empty-reason placeholder it does not have.
        if label.reason != "" {
            #expect(!lines.contains(#"datamode_requests_total{outcome="\#(label.outcome)",reason=""} 0"#))
        }
    }

    @Test("gauges, counters and the reload counts")
    func counters() throws {
        let admin = try AdminFixture()
        var metrics = MetricsSnapshot()
        metrics.bytesIn = 10
        metrics.bytesOut = 2048
        metrics.connectionsActive = 4
        metrics.tunnelSplices = 5
        metrics.logDropped = 6
        admin.metrics.value = metrics
        admin.reloads.value = ReloadCounts(ok: 7, failed: 8)
        let lines = Self.lines(admin)
        for expected in [
            #"datamode_bytes_total{direction="in"} 10"#, #"datamode_bytes_total{direction="out"} 2048"#,
            "datamode_connections_active 4", "datamode_tunnel_splices_total 5", "datamode_log_dropped_total 6",
            #"datamode_reloads_total{result="ok"} 7"#, #"datamode_reloads_total{result="failed"} 8"#,
        ] {
            #expect(lines.contains(expected), "missing \(expected)")
        }
    }

    @Test("the duration histogram is cumulative")
    func histogram() throws {
        let admin = try AdminFixture()
        var metrics = MetricsSnapshot()
        metrics.durationBuckets[0] = 1      // ≤ 0.0005 s
        metrics.durationBuckets[2] = 2      // ≤ 0.0025 s
        metrics.durationCount = 4           // one above every bound
        metrics.durationSumSeconds = 12.5
        admin.metrics.value = metrics
        let lines = Self.lines(admin)
        #expect(lines.contains(#"datamode_request_duration_seconds_bucket{le="0.0005"} 1"#))
        #expect(lines.contains(#"datamode_request_duration_seconds_bucket{le="0.001"} 1"#))
        #expect(lines.contains(#"datamode_request_duration_seconds_bucket{le="0.0025"} 3"#))
        #expect(lines.contains(#"datamode_request_duration_seconds_bucket{le="10.0"} 3"#))
        #expect(lines.contains(#"datamode_request_duration_seconds_bucket{le="+Inf"} 4"#))
        #expect(lines.contains("datamode_request_duration_seconds_sum 12.5"))
        #expect(lines.contains("datamode_request_duration_seconds_count 4"))
    }

    @Test("the mode gauges follow the runtime")
    func modeGauges() throws {
        let admin = try AdminFixture()
        admin.runtime.update { $0.mode = DataMode(constrained: false, expensive: true) }
        let lines = Self.lines(admin)
        #expect(lines.contains(#"datamode_mode{condition="constrained"} 0"#))
        #expect(lines.contains(#"datamode_mode{condition="expensive"} 1"#))
    }

    @Test("other methods: 405 with Allow", arguments: ["PUT", "DELETE", "POST"])
    func otherMethods(_ method: String) throws {
        let response = try AdminFixture().handle(method, "/metrics")
        expectProblem(response, 405, "method-not-allowed")
        #expect(response.header("Allow") == "GET, HEAD")
    }
}
