import DatamodeState

/// The admin page (SPEC §20): one self-contained document, HTML, CSS and JavaScript, built into the binary. It
/// reads only the admin API of the listener that served it (the Content-Security-Policy below forbids anything
/// else), follows `GET /events` for the mode, the profile, budgets and the deferred queue, and polls
/// `/refusals`, `/stats/timeline` and `/budgets` every 2 s. A change of mode asks for `admin.token` once and
/// keeps it for the tab (sessionStorage). No build step: what is below is what the browser runs.
enum AdminPage {
    /// `GET /` and `HEAD /`.
    static func handle(_ request: AdminRequest) -> AdminResponse {
        AdminResponse(status: 200, headers: [
            ("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
            ("Content-Security-Policy", contentSecurityPolicy), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ], body: html)
    }

    /// Only this listener, and no frame may hold the page (its buttons change the mode).
    static let contentSecurityPolicy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        + "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    static let html = Array(document.utf8)

    private static let document = #"""
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>datamode-proxy</title>
<style>
  :root { --ink: #1d2430; --muted: #6b7585; --line: #dde2ea; --card: #fff; --bg: #f3f5f8;
          --accent: #2f6fde; --refused: #c8423b; --saved: #2e9d5b; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, sans-serif; color: var(--ink); background: var(--bg); }
  header { display: flex; align-items: center; gap: 12px; padding: 10px 18px; background: #1d2430; color: #fff; }
  header h1 { font-size: 16px; margin: 0; font-weight: 600; }
  #live { font-size: 12px; padding: 2px 8px; border-radius: 10px; background: #6b7585; }
  #live.on { background: var(--saved); }
  #token-form { margin-left: auto; display: flex; gap: 6px; font-size: 12px; }
  #token-form.needed input { outline: 2px solid #f2b233; }
  main { display: grid; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr)); gap: 14px; padding: 14px 18px; }
  section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
  section.wide { grid-column: 1 / -1; }
  h2 { font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); margin: 0 0 8px; }
  #mode { font-size: 24px; font-weight: 650; }
  .muted { color: var(--muted); font-size: 12px; }
  .buttons { display: flex; flex-wrap: wrap; gap: 6px; margin-top: 10px; }
  button { font: inherit; padding: 4px 10px; border: 1px solid var(--line); border-radius: 6px; background: #f8f9fb; cursor: pointer; }
  button.active { background: var(--accent); border-color: var(--accent); color: #fff; }
  table { width: 100%; border-collapse: collapse; font-size: 12px; }
  th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid var(--line); vertical-align: top; }
  td.url { word-break: break-all; }
  .error { color: var(--refused); font-weight: 600; }
  .gauge { height: 10px; background: #e7ebf1; border-radius: 5px; overflow: hidden; margin: 4px 0 8px; }
  .gauge div { height: 100%; background: var(--accent); }
  .gauge.spent div { background: var(--refused); }
  svg { width: 100%; height: 130px; display: block; }
  .legend span { margin-right: 12px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
  #message { color: var(--refused); font-size: 12px; min-height: 1em; }
</style>
</head>
<body>
<header>
  <h1>datamode-proxy</h1><span id="live">offline</span>
  <form id="token-form"><input id="token" type="password" placeholder="admin token" autocomplete="off"><button id="token-save">use token</button></form>
</header>
<main>
  <section><h2>Data mode</h2>
    <div id="mode">…</div><div class="muted" id="mode-source"></div>
    <div class="buttons" id="mode-buttons"></div><div id="message"></div></section>
  <section><h2>Link profile</h2><div id="profile">…</div><div class="muted" id="profile-detail"></div></section>
  <section><h2>Budgets</h2><div id="budgets" class="muted">none configured</div></section>
  <section class="wide"><h2>Bytes relayed per second (in: from clients, out: to clients)</h2><svg id="relayed-chart" viewBox="0 0 600 130" preserveAspectRatio="none"></svg>
    <div class="legend" id="relayed-legend"></div></section>
  <section class="wide"><h2>Bytes saved per second, by kind</h2><svg id="saved-chart" viewBox="0 0 600 130" preserveAspectRatio="none"></svg>
    <div class="legend" id="saved-legend"></div></section>
  <section class="wide"><h2>Latest refusals</h2>
    <table><thead><tr><th>time</th><th>client</th><th>request</th><th>error</th><th>rule</th><th>session</th></tr></thead>
    <tbody id="refusals"></tbody></table></section>
  <section><h2>Sessions</h2><div id="sessions" class="muted">none</div></section>
  <section><h2>Schedule</h2><div id="schedule" class="muted">none</div></section>
  <section id="deferred-card" hidden><h2>Deferred uploads</h2><div id="deferred" class="muted">none</div></section>
</main>
<script>
"use strict";
// Everything here comes from the admin API of the listener that served this page (SPEC §20): no other origin.
const $ = id => document.getElementById(id);
const MODES = [["normal", "normal"], ["constrained", "constrained"], ["expensive", "expensive"],
               ["constrained-expensive", "constrained + expensive"], ["satellite", "satellite"]];
const COLORS = { in: "#2f6fde", out: "#8a5cd6", variant: "#2e9d5b", rejected: "#c8423b", "hls-cap": "#e08a1e",
                 "dash-cap": "#c9a227", transcoded: "#1f9aa8" };
let token = sessionStorage.getItem("datamode-admin-token") || "";

function el(tag, text, cls) { const e = document.createElement(tag); if (text != null) e.textContent = text; if (cls) e.className = cls; return e; }
function bytes(n) { const u = ["B", "kB", "MB", "GB", "TB"]; let i = 0; while (n >= 1000 && i < 4) { n /= 1000; i++; } return (i ? n.toFixed(1) : n) + " " + u[i]; }
function clock(iso) { return new Date(iso).toLocaleTimeString(); }

/// A request to the admin API with the tab's token; a 401 asks for the token (once per tab) and says so.
async function api(method, path, body) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  $("token-form").classList.toggle("needed", response.status === 401);
  if (!response.ok) throw new Error(method + " " + path + ": " + response.status);
  return response.json();
}

function showMode(m) {
  $("mode").textContent = m.mode;
  $("mode-source").textContent = "set by " + m.source + (m.budget ? " (" + m.budget + ")" : "") + " since " + clock(m.since);
  for (const b of $("mode-buttons").children) b.classList.toggle("active", b.dataset.mode === m.mode
    || (b.dataset.mode === "satellite" && m.mode === "constrained-expensive-ultra-constrained"));
  if ("profile" in m) loadConditions();
}

async function setMode(name) {
  $("message").textContent = "";
  try { showMode(name ? await api("PUT", "/mode", { mode: name }) : await api("DELETE", "/mode")); }
  catch (e) { $("message").textContent = token ? e.message : "changing the mode needs the admin token (top right)"; }
}

async function loadConditions() {
  const c = await api("GET", "/conditions");
  $("profile").textContent = c.profile || "no shaping";
  $("profile-detail").textContent = c.profile ? "from " + c.source + (c.condition ? " (" + c.condition + ")" : "") : "";
}

async function loadBudgets() {
  const list = await api("GET", "/budgets");
  const box = $("budgets"); box.replaceChildren();
  if (!list.length) { box.textContent = "none configured"; return; }
  for (const b of list) {
    const row = el("div"); row.append(el("b", b.name), el("span", "  " + bytes(b.used) + " of " + bytes(b.bytes) + " · resets " + clock(b.resetsAt), "muted"));
    const gauge = el("div", null, "gauge" + (b.spent ? " spent" : "")); const fill = el("div");
    fill.style.width = Math.min(100, 100 * b.used / Math.max(1, b.bytes)) + "%"; gauge.append(fill);
    row.dataset.budget = b.name; box.append(row, gauge);
  }
}

async function loadRefusals() {
  const { refusals } = await api("GET", "/refusals");
  $("refusals").replaceChildren(...refusals.slice(0, 50).map(r => {
    const tr = el("tr");
    tr.append(el("td", clock(r.time)), el("td", r.client), el("td", r.method + " " + r.url, "url"),
              el("td", r.reasons.join(", "), "error"), el("td", r.rule || "–"), el("td", r.session || "–"));
    return tr;
  }));
}

/// Lines of per-second values, on one scale (the top is the largest second), over the time the timeline covers:
/// from its first point (at least the last 5 minutes, at most the hour it keeps) to now.
function chart(svg, legend, points, series) {
  const now = Math.floor(Date.now() / 1000), W = 600, H = 120;
  const span = Math.min(3600, Math.max(300, now - (points.length ? points[0].t : now) + 1));
  const max = Math.max(1, ...series.flatMap(s => points.map(s.value)));
  svg.replaceChildren(); legend.replaceChildren();
  for (const s of series) {
    const d = points.map((p, i) => (i ? "L" : "M") + (W - (now - p.t) * W / span).toFixed(1) + " " + (H + 5 - s.value(p) * H / max).toFixed(1)).join(" ");
    const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("d", d || "M0 125"); path.setAttribute("fill", "none"); path.setAttribute("stroke", COLORS[s.name] || "#555");
    path.setAttribute("stroke-width", "1.5"); path.setAttribute("vector-effect", "non-scaling-stroke"); path.dataset.series = s.name;
    svg.append(path);
    const total = points.reduce((sum, p) => sum + s.value(p), 0);
    const key = el("span"); const swatch = el("i"); swatch.style.background = COLORS[s.name] || "#555";
    key.append(swatch, s.name + " " + bytes(total)); legend.append(key);
  }
  legend.append(el("span", "peak " + bytes(max) + "/s · last " + Math.round(span / 60) + " min", "muted"));
}

async function loadTimeline() {
  const { points } = await api("GET", "/stats/timeline");
  chart($("relayed-chart"), $("relayed-legend"), points,
        [{ name: "in", value: p => p.bytesIn }, { name: "out", value: p => p.bytesOut }]);
  const kinds = [...new Set(points.flatMap(p => Object.keys(p.saved)))].sort();
  chart($("saved-chart"), $("saved-legend"), points,
        (kinds.length ? kinds : ["variant"]).map(k => ({ name: k, value: p => p.saved[k] || 0 })));
}

async function loadSessions() {
  const { enabled, sessions } = await api("GET", "/sessions");
  const box = $("sessions"); box.replaceChildren();
  if (!enabled) { box.textContent = "sessions are off (sessions: {enabled: true})"; return; }
  if (!sessions.length) { box.textContent = "none"; return; }
  for (const s of sessions) box.append(el("div", s.id + ": " + s.mode + (s.profile ? " · " + s.profile : "") + " · " + (s.requestsTotal || 0) + " requests"));
}

async function loadSchedule() {
  const { schedules } = await api("GET", "/schedule");
  const box = $("schedule"); box.replaceChildren();
  if (!schedules.length) { box.textContent = "none"; return; }
  for (const s of schedules) box.append(el("div", (s.session || "global") + ": " + s.steps.map(x => x.mode + " after " + x.after).join(" → ") + (s.repeat ? " (repeats)" : "")));
}

async function loadDeferred() {
  try {
    const list = await api("GET", "/deferred");
    $("deferred-card").hidden = false;
    $("deferred").replaceChildren(...(list.length ? list.slice(0, 20).map(d => el("div", d.status + " " + d.method + " " + d.url + " (" + bytes(d.bytes) + ")")) : [el("span", "none")]));
  } catch { $("deferred-card").hidden = true; }  // 503: no deferral store
}

function quietly(load) { return load().catch(() => {}); }

/// `GET /events` through fetch (an EventSource cannot send the token), one event at a time.
async function follow() {
  for (;;) {
    try {
      const response = await fetch("/events", { headers: token ? { Authorization: "Bearer " + token } : {} });
      if (!response.ok) throw new Error(response.status);
      $("live").textContent = "live"; $("live").className = "on";
      const reader = response.body.getReader(), decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        for (let end; (end = buffer.indexOf("\n\n")) >= 0; buffer = buffer.slice(end + 2)) onEvent(buffer.slice(0, end));
      }
    } catch { /* retried below */ }
    $("live").textContent = "offline"; $("live").className = "";
    await new Promise(resolve => setTimeout(resolve, 2000));
  }
}

function onEvent(block) {
  let type = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) type = line.slice(7); else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (!data) return;
  const event = JSON.parse(data);
  if (type === "mode") { if (event.scope === "global") showMode(event); else quietly(loadSessions); }
  else if (type === "conditions") quietly(loadConditions);
  else if (type === "budget") quietly(loadBudgets);
  else if (type === "deferred") quietly(loadDeferred);
  else if (type === "reload") loadAll();
}

function loadAll() {
  for (const load of [loadConditions, loadBudgets, loadRefusals, loadTimeline, loadSessions, loadSchedule, loadDeferred]) quietly(load);
}

for (const [name, label] of MODES) {
  const b = el("button", label); b.dataset.mode = name; b.onclick = () => setMode(name); $("mode-buttons").append(b);
}
const reset = el("button", "reset"); reset.title = "back to the flag/config mode"; reset.onclick = () => setMode(null);
$("mode-buttons").append(reset);
$("token").value = token;
$("token-form").onsubmit = e => { e.preventDefault(); token = $("token").value.trim(); sessionStorage.setItem("datamode-admin-token", token); loadAll(); };
quietly(async () => showMode(await api("GET", "/mode")));
loadAll();
follow();
setInterval(() => { quietly(loadRefusals); quietly(loadTimeline); quietly(loadBudgets); }, 2000);
setInterval(() => { quietly(loadSessions); quietly(loadSchedule); }, 5000);
</script>
</body>
</html>
"""#
}
