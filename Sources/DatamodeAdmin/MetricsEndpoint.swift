import DatamodePolicy
import DatamodeState

/// `GET /metrics`: Prometheus text exposition format 0.0.4 (SPEC §7), from the workers' counters summed now.
struct MetricsEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        var text = Self.render(api.metrics(), api.runtime.load().snapshot, reloads: api.reloads(), storeUp: api.storeUp)
        text += Self.renderBudgets(api.budgets, now: api.now())
        return AdminResponse(status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")], body: Array(text.utf8))
    }

    /// `datamode_budget_used_bytes{budget}` and `datamode_budget_spent{budget}` (SPEC §11).
    static func renderBudgets(_ ledger: BudgetLedger, now: Int64) -> String {
        guard !ledger.isEmpty else { return "" }
        var out = "# HELP datamode_budget_used_bytes Bytes exchanged with origins in the budget's current period.\n"
        out += "# TYPE datamode_budget_used_bytes gauge\n"
        for (index, budget) in ledger.budgets.enumerated() {
            out += "datamode_budget_used_bytes{budget=\"\(budget.name)\"} \(ledger.used(index))\n"
        }
        out += "# HELP datamode_budget_spent Whether the budget is spent (1) until its period ends.\n"
        out += "# TYPE datamode_budget_spent gauge\n"
        for (index, budget) in ledger.budgets.enumerated() {
            out += "datamode_budget_spent{budget=\"\(budget.name)\"} \(ledger.isSpent(index, now: now) ? 1 : 0)\n"
        }
        return out
    }

    static func render(_ metrics: MetricsSnapshot, _ snapshot: RuntimeSnapshot, reloads: ReloadCounts,
                       storeUp: (() -> Bool)? = nil) -> String {
        var out = ""
        out += "# HELP datamode_requests_total Requests answered, by outcome and reason (an error code of SPEC §6, or empty).\n"
        out += "# TYPE datamode_requests_total counter\n"
        var series = metrics.requests
        for outcome in WorkerMetrics.outcomes where !series.keys.contains(where: { $0.outcome == outcome }) {
            series[RequestLabel(outcome: outcome, reason: ""), default: 0] += 0
        }
        for (label, value) in series.sorted(by: { ($0.key.outcome, $0.key.reason) < ($1.key.outcome, $1.key.reason) }) {
            out += "datamode_requests_total{outcome=\"\(label.outcome)\",reason=\"\(label.reason)\"} \(value)\n"
        }
        out += "# HELP datamode_bytes_total Body bytes relayed: in = from clients, out = to clients.\n"
        out += "# TYPE datamode_bytes_total counter\n"
        out += "datamode_bytes_total{direction=\"in\"} \(metrics.bytesIn)\n"
        out += "datamode_bytes_total{direction=\"out\"} \(metrics.bytesOut)\n"
        out += "# HELP datamode_connections_active Client connections open now.\n"
        out += "# TYPE datamode_connections_active gauge\n"
        out += "datamode_connections_active \(metrics.connectionsActive)\n"
        out += "# HELP datamode_held_requests Requests held now for their refusal to lift (Prefer: wait, a rule's hold).\n"
        out += "# TYPE datamode_held_requests gauge\n"
        out += "datamode_held_requests \(metrics.heldRequests)\n"
        out += "# HELP datamode_deferred_total Stored uploads by outcome: queued, delivered, failed, expired, cancelled; full = refused, the queue or the disk was full.\n"
        out += "# TYPE datamode_deferred_total counter\n"
        for (outcome, count) in metrics.deferred { out += "datamode_deferred_total{outcome=\"\(outcome)\"} \(count)\n" }
        out += "# HELP datamode_deferred_queue_entries Stored uploads not delivered yet (queued or delivering).\n"
        out += "# TYPE datamode_deferred_queue_entries gauge\n"
        out += "datamode_deferred_queue_entries \(metrics.deferredQueueEntries)\n"
        out += "# HELP datamode_deferred_queue_bytes Body bytes of the stored uploads not delivered yet.\n"
        out += "# TYPE datamode_deferred_queue_bytes gauge\n"
        out += "datamode_deferred_queue_bytes \(metrics.deferredQueueBytes)\n"
        out += "# HELP datamode_connections_parked Client connections idle between requests with their buffers freed.\n"
        out += "# TYPE datamode_connections_parked gauge\n"
        out += "datamode_connections_parked \(metrics.connectionsParked)\n"
        out += "# HELP datamode_tunnel_splices_total Tunnels handed to the kernel's splice(2) relay once established.\n"
        out += "# TYPE datamode_tunnel_splices_total counter\n"
        out += "datamode_tunnel_splices_total \(metrics.tunnelSplices)\n"
        out += "# HELP datamode_body_splices_total Content-Length response bodies moved with splice(2) instead of through user space.\n"
        out += "# TYPE datamode_body_splices_total counter\n"
        out += "datamode_body_splices_total \(metrics.bodySplices)\n"
        out += "# HELP datamode_bytes_saved_total Response bytes clients did not receive, by mechanism: variants and refusals of URLs whose length was seen before, manifest caps, transcodes (SPEC §13).\n"
        out += "# TYPE datamode_bytes_saved_total counter\n"
        for kind in ["variant", "rejected", "hls-cap", "dash-cap", "transcoded"] {
            out += "datamode_bytes_saved_total{kind=\"\(kind)\"} \(metrics.bytesSaved[kind, default: 0])\n"
        }
        out += "# HELP datamode_manifests_untouched_total Manifests under a cap passed through unchanged: over 1 MiB, or malformed.\n"
        out += "# TYPE datamode_manifests_untouched_total counter\n"
        for reason in ["too-large", "malformed"] {
            out += "datamode_manifests_untouched_total{reason=\"\(reason)\"} \(metrics.manifestsUntouched[reason, default: 0])\n"
        }
        out += "# HELP datamode_images_transcoded_total Images resized and re-encoded (SPEC §13).\n"
        out += "# TYPE datamode_images_transcoded_total counter\n"
        out += "datamode_images_transcoded_total \(metrics.imagesTranscoded)\n"
        out += "# HELP datamode_image_cache_hits_total Transcoded images served from the cache (URL, validators, format).\n"
        out += "# TYPE datamode_image_cache_hits_total counter\n"
        out += "datamode_image_cache_hits_total \(metrics.imageCacheHits)\n"
        out += "# HELP datamode_images_untouched_total Images under transcoding passed through unchanged, by reason.\n"
        out += "# TYPE datamode_images_untouched_total counter\n"
        for reason in ["too-large", "too-many-pixels", "animated", "undecodable", "not-smaller", "busy",
                       "too-many-scans", "too-slow"] {
            out += "datamode_images_untouched_total{reason=\"\(reason)\"} \(metrics.imagesUntouched[reason, default: 0])\n"
        }
        out += "# HELP datamode_log_dropped_total Access log lines dropped because their destination did not keep up.\n"
        out += "# TYPE datamode_log_dropped_total counter\n"
        out += "datamode_log_dropped_total \(metrics.logDropped)\n"
        out += "# HELP datamode_tls_intercepted_total HTTPS tunnels intercepted: client handshakes completed with a leaf of the local CA.\n"
        out += "# TYPE datamode_tls_intercepted_total counter\n"
        out += "datamode_tls_intercepted_total \(metrics.tlsIntercepted)\n"
        out += "# HELP datamode_transparent_connections_total Connections on the transparent listener, by what they were (SPEC §16).\n"
        out += "# TYPE datamode_transparent_connections_total counter\n"
        for kind in TransparentKind.allCases {
            out += "datamode_transparent_connections_total{kind=\"\(kind.rawValue)\"} \(metrics.transparentConnections[kind.rawValue, default: 0])\n"
        }
        out += "# HELP datamode_tls_handshake_failures_total TLS handshakes that failed, by side (client, origin) and reason.\n"
        out += "# TYPE datamode_tls_handshake_failures_total counter\n"
        for label in TLSFailureLabel.all {
            let value = metrics.tlsHandshakeFailures[label] ?? 0
            out += "datamode_tls_handshake_failures_total{side=\"\(label.side.rawValue)\",reason=\"\(label.reason.rawValue)\"} \(value)\n"
        }
        out += "# HELP datamode_http2_connections_active HTTP/2 connections open, by side (client: intercepted TLS that chose h2; origin: TLS origins that chose h2).\n"
        out += "# TYPE datamode_http2_connections_active gauge\n"
        out += "datamode_http2_connections_active{side=\"client\"} \(metrics.http2ConnectionsActive)\n"
        out += "datamode_http2_connections_active{side=\"origin\"} \(metrics.http2OriginConnectionsActive)\n"
        out += "# HELP datamode_http2_streams_total HTTP/2 streams that carried a request, by side.\n"
        out += "# TYPE datamode_http2_streams_total counter\n"
        out += "datamode_http2_streams_total{side=\"client\"} \(metrics.http2Streams)\n"
        out += "datamode_http2_streams_total{side=\"origin\"} \(metrics.http2OriginStreams)\n"
        out += "# HELP datamode_http2_errors_total HTTP/2 limits tripped and protocol errors, by side and reason (SPEC §17).\n"
        out += "# TYPE datamode_http2_errors_total counter\n"
        for reason in WorkerMetrics.http2ErrorReasons {
            out += "datamode_http2_errors_total{side=\"client\",reason=\"\(reason)\"} \(metrics.http2Errors[reason, default: 0])\n"
            out += "datamode_http2_errors_total{side=\"origin\",reason=\"\(reason)\"} \(metrics.http2OriginErrors[reason, default: 0])\n"
        }
        out += "# HELP datamode_mode Whether each condition of the data mode holds (1) or not (0).\n"
        out += "# TYPE datamode_mode gauge\n"
        out += "datamode_mode{condition=\"constrained\"} \(snapshot.mode.constrained ? 1 : 0)\n"
        out += "datamode_mode{condition=\"expensive\"} \(snapshot.mode.expensive ? 1 : 0)\n"
        out += "datamode_mode{condition=\"ultra-constrained\"} \(snapshot.mode.ultraConstrained ? 1 : 0)\n"
        out += "# HELP datamode_link_profile The link profile in force (SPEC §10): 1 for its name and source; none when unshaped.\n"
        out += "# TYPE datamode_link_profile gauge\n"
        let resolution = snapshot.profileInForce
        out += "datamode_link_profile{profile=\"\(resolution.profile?.name ?? "none")\",source=\"\(resolution.source.rawValue)\"} 1\n"
        out += "# HELP datamode_variants Registered variants by source.\n"
        out += "# TYPE datamode_variants gauge\n"
        let api = snapshot.policy.variants.filter { $0.source == .api }.count
        out += "datamode_variants{source=\"config\"} \(snapshot.policy.variants.count - api)\n"
        out += "datamode_variants{source=\"api\"} \(api)\n"
        out += "# HELP datamode_store_up Whether the state store is reachable (SPEC §19): always 1 for the state directory.\n"
        out += "# TYPE datamode_store_up gauge\n"
        out += "datamode_store_up{kind=\"\(storeUp == nil ? "file" : "redis")\"} \((storeUp?() ?? true) ? 1 : 0)\n"
        out += "# HELP datamode_reloads_total Configuration reloads (SIGHUP): ok = applied, failed = refused, the running one kept.\n"
        out += "# TYPE datamode_reloads_total counter\n"
        out += "datamode_reloads_total{result=\"ok\"} \(reloads.ok)\n"
        out += "datamode_reloads_total{result=\"failed\"} \(reloads.failed)\n"
        out += "# HELP datamode_request_duration_seconds Time from the first byte of a request head to the end of its response.\n"
        out += "# TYPE datamode_request_duration_seconds histogram\n"
        var cumulative = 0
        for (index, bound) in WorkerMetrics.durationBuckets.enumerated() {
            cumulative += metrics.durationBuckets[index]
            out += "datamode_request_duration_seconds_bucket{le=\"\(bound)\"} \(cumulative)\n"
        }
        out += "datamode_request_duration_seconds_bucket{le=\"+Inf\"} \(metrics.durationCount)\n"
        out += "datamode_request_duration_seconds_sum \(metrics.durationSumSeconds)\n"
        out += "datamode_request_duration_seconds_count \(metrics.durationCount)\n"
        return out
    }
}
