import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Headless Chromium driven through the DevTools protocol over `--remote-debugging-pipe` (NUL-delimited JSON on
/// file descriptors 3 and 4: no WebSocket, no extra package), for tests of a live page: load it, wait for what
/// its script shows, click and type as a person does (real input events at an element's position), take a
/// screenshot. A scenario is a list of steps run in order by one Python process; what `value` steps read comes
/// back by name.
public enum BrowserDriver {
    public enum Step {
        case navigate(String)
        /// Waits until the JavaScript expression is truthy (a failure names it).
        case wait(String, timeout: Double = 20)
        /// Reads the expression's value (JSON) as `name`.
        case value(String, name: String)
        /// A left click at the centre of the first element `selector` matches.
        case click(String)
        /// Types `text` into the focused element.
        case insertText(String)
        /// A PNG of the viewport.
        case screenshot(path: String)
        /// An HTTP request made beside the page (another operator, another tool).
        case http(method: String, url: String, headers: [String: String], body: String?)

        var json: [String: Any] {
            switch self {
            case .navigate(let url): ["navigate": url]
            case .wait(let expression, let timeout): ["wait": expression, "timeout": timeout]
            case .value(let expression, let name): ["value": expression, "name": name]
            case .click(let selector): ["click": selector]
            case .insertText(let text): ["insertText": text]
            case .screenshot(let path): ["screenshot": path]
            case .http(let method, let url, let headers, let body):
                ["http": ["method": method, "url": url, "headers": headers, "body": body as Any? ?? NSNull()]]
            }
        }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Runs `steps` in a fresh profile under `directory` in a `width` × `height` viewport; the values read, by name.
    public static func run(_ steps: [Step], directory: String, width: Int = 1280, height: Int = 900,
                           timeout: Double = 120) throws -> [String: Any] {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let scenario: [String: Any] = [
            "chromium": try HeadlessChromium.locate(), "profile": directory + "/profile", "width": width, "height": height,
            "noSandbox": geteuid() == 0, "steps": steps.map(\.json),
        ]
        let scenarioPath = directory + "/scenario.json"
        let scriptPath = directory + "/driver.py"
        try JSONSerialization.data(withJSONObject: scenario).write(to: URL(fileURLWithPath: scenarioPath))
        try script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        let environment = [
            "HOME": directory, "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            "XDG_CONFIG_HOME": directory + "/.config", "XDG_CACHE_HOME": directory + "/.cache",
        ]
        let result = try ExternalCommand.run("/usr/bin/env", ["python3", scriptPath, scenarioPath], environment: environment,
                                             timeout: timeout)
        guard result.status == 0,
              let values = try? JSONSerialization.jsonObject(with: Data(result.stdoutBytes)) as? [String: Any] else {
            throw Failure(description: "the browser scenario failed (exit \(result.status)):\n\(result.output.suffix(4000))")
        }
        return values
    }

    static let script = #"""
import base64, json, os, subprocess, sys, time, urllib.request

scenario = json.load(open(sys.argv[1]))
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()
arguments = ["--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-proxy-server", "--hide-scrollbars", "--mute-audio", "--disable-dev-shm-usage",
             "--user-data-dir=" + scenario["profile"], "about:blank"]
if scenario["noSandbox"]:
    arguments.insert(0, "--no-sandbox")
# fd 3 is what the browser reads, fd 4 what it writes (--remote-debugging-pipe).
browser = subprocess.Popen(["bash", "-c", 'exec "$0" "$@" 3<&%d 4>&%d' % (to_chrome_r, from_chrome_w), scenario["chromium"]]
                           + arguments, pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.close(to_chrome_r)
os.close(from_chrome_w)
buffer = b""
next_id = 0

def call(method, params=None, session=None):
    global buffer, next_id
    next_id += 1
    message = {"id": next_id, "method": method, "params": params or {}}
    if session:
        message["sessionId"] = session
    os.write(to_chrome_w, json.dumps(message).encode() + b"\0")
    while True:
        while b"\0" not in buffer:
            chunk = os.read(from_chrome_r, 1 << 16)
            if not chunk:
                raise SystemExit("the browser closed the pipe during " + method)
            buffer += chunk
        raw, _, buffer = buffer.partition(b"\0")
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise SystemExit(method + ": " + json.dumps(reply["error"]))
            return reply.get("result", {})

def evaluate(session, expression):
    result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, session)
    if "exceptionDetails" in result:
        raise SystemExit("evaluating " + expression + ": " + json.dumps(result["exceptionDetails"])[:500])
    return result["result"].get("value")

values = {}
try:
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Emulation.setDeviceMetricsOverride", {"width": scenario["width"], "height": scenario["height"],
                                                "deviceScaleFactor": 1, "mobile": False}, session)
    for step in scenario["steps"]:
        if "navigate" in step:
            call("Page.navigate", {"url": step["navigate"]}, session)
        elif "wait" in step:
            deadline = time.time() + step["timeout"]
            # Before the page has loaded (or while it is still building its DOM) the expression may throw: not yet.
            guarded = "(() => { try { return !!(%s); } catch (e) { return false; } })()" % step["wait"]
            while not evaluate(session, guarded):
                if time.time() > deadline:
                    raise SystemExit("timed out waiting for " + step["wait"] + "; page text: "
                                     + str(evaluate(session, "document.body && document.body.innerText"))[:2000])
                time.sleep(0.1)
        elif "value" in step:
            values[step["name"]] = evaluate(session, step["value"])
        elif "click" in step:
            box = evaluate(session, "(() => { const r = document.querySelector(%s).getBoundingClientRect();"
                                    " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % json.dumps(step["click"]))
            for kind in ("mousePressed", "mouseReleased"):
                call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                     session)
        elif "insertText" in step:
            call("Input.insertText", {"text": step["insertText"]}, session)
        elif "screenshot" in step:
            data = call("Page.captureScreenshot", {"format": "png"}, session)["data"]
            open(step["screenshot"], "wb").write(base64.b64decode(data))
        elif "http" in step:
            spec = step["http"]
            body = spec["body"].encode() if spec["body"] is not None else None
            request = urllib.request.Request(spec["url"], data=body, method=spec["method"], headers=spec["headers"])
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
finally:
    try:
        call("Browser.close")
    except BaseException:
        pass
    try:
        browser.wait(timeout=10)
    except subprocess.TimeoutExpired:
        browser.kill()
print(json.dumps(values))
"""#
}
