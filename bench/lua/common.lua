-- Shared by the bench's wrk scripts: print one machine-readable summary line at the end.
function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"duration_us":%d,"requests":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"lat_p50_us":%d,"lat_p90_us":%d,"lat_p99_us":%d,"lat_mean_us":%.1f,"lat_max_us":%d}\n',
      summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
