import DatamodeConfig
@testable import DatamodeEngine
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
import Testing

/// Admission as a table (SPEC §6–§12): a request head, its source and the settings in, a verdict out, without a
/// socket, a buffer or a clock. Each row is one rule a proxy owes, in the order it is checked.
@Suite struct AdmissionTests {
    /// A fixed budget view: which budgets exist and which are spent.
    struct Budgets: BudgetView {
        var budgets: [Budget] = []
        var spent: Set<Int> = []
        var periodEnds: [Int: Int64] = [:]
        func isSpent(_ index: Int, now: Int64) -> Bool { spent.contains(index) }
        func periodEnd(_ index: Int) -> Int64 { periodEnds[index] ?? 86_400 }
    }

    static func settings(_ yaml: String, mode: DataMode = .normal) throws -> WorkerSettings {
        let configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: "/")
        let snapshot = RuntimeSnapshot(configuration: configuration,
                                       policy: try ConfigurationSnapshot(configuration: configuration).policy,
                                       mode: mode, modeSource: .default, modeSince: 0)
        return WorkerSettings(snapshot)
    }

    static func head(_ text: String) -> RequestHead {
        let bytes = Array(text.utf8)
        guard case .complete(let head, _) = bytes.withUnsafeBytes({ HTTP1Parser.parseRequestHead($0, limits: HTTPLimits()) })
        else { fatalError("not a head: \(text)") }
        return head
    }

    static let local = IPAddress("127.0.0.1")
    static let outside = IPAddress("192.0.2.7")

    static func admit(_ request: String, source: RequestSource = .forwardProxy, client: IPAddress? = local,
                      settings: WorkerSettings, budgets: Budgets = Budgets(), intercepts: Bool = false) -> Admission {
        Admission.admit(head(request), source: source, client: client, clientText: "client", settings: settings,
                        budgets: budgets, intercepts: { _ in intercepts }, now: 0)
    }

    /// The verdict as a short word and the error code, for tables.
    static func summary(_ admission: Admission) -> String {
        switch admission.verdict {
        case .refuse(let code, _, let close, _): "refuse \(code.rawValue)\(close ? " close" : "")"
        case .reject(let rejection, let budget): "reject \(rejection.code.rawValue)" + (budget.map { " budget=\($0)" } ?? "")
        case .budgetExhausted(let index): "budget-exhausted \(index)"
        case .intercept(let target): "intercept \(target.host):\(target.port)"
        case .tunnel(let target): "tunnel \(target.host):\(target.port)"
        case .forward(let target, _): "forward \(target.absoluteURL)"
        case .serveVariant(_, _, let rewrite): "variant \(rewrite.id)"
        }
    }

    @Test func theChecksOfAPlainProxyRequestInTheirOrder() throws {
        let plain = try Self.settings("")
        let rows: [(String, String)] = [
            ("GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", "forward http://a.example/x"),
            // Framing first: ambiguous bodies are refused and the connection closed, whatever else is wrong.
            ("POST http://a.example/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
             "refuse bad-request close"),
            ("GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", "refuse bad-request close"),
            ("GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n", "refuse not-a-proxy-request"),
            ("GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\nVia: 1.1 datamode-proxy\r\n\r\n", "refuse loop-detected"),
            ("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", "tunnel a.example:443"),
        ]
        for (request, expected) in rows {
            #expect(Self.summary(Self.admit(request, settings: plain)) == expected, "\(request.debugDescription)")
        }
        #expect(Self.summary(Self.admit(rows[0].0, client: Self.outside, settings: plain)) == "refuse access-denied close")
        #expect(Self.summary(Self.admit(rows[5].0, settings: plain, intercepts: true)) == "intercept a.example:443")
    }

    @Test func keepAliveFollowsTheVersionAndConnectionTokens() throws {
        let plain = try Self.settings("")
        #expect(Self.admit("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", settings: plain).keepAlive)
        #expect(!Self.admit("GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", settings: plain).keepAlive)
        #expect(!Self.admit("GET http://a/ HTTP/1.0\r\nHost: a\r\n\r\n", settings: plain).keepAlive)
        #expect(Self.admit("GET http://a/ HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n", settings: plain).keepAlive)
    }

    @Test func basicAuthOnTheProxyPortAndTheConnectsUserInsideATunnel() throws {
        let settings = try Self.settings("access: {allow: [127.0.0.0/8], users: {alice: secret}}")
        let get = "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
        let refused = Self.admit(get + "\r\n", settings: settings)
        #expect(Self.summary(refused) == "refuse proxy-auth-required")
        if case .refuse(_, _, _, let fields) = refused.verdict {
            #expect(fields.first?.0 == "Proxy-Authenticate")
        }
        // alice:secret
        let admitted = Self.admit(get + "Proxy-Authorization: Basic YWxpY2U6c2VjcmV0\r\n\r\n", settings: settings)
        #expect(Self.summary(admitted) == "forward http://a.example/")
        #expect(admitted.proxyUser == "alice")
        // Inside an intercepted tunnel no credentials are asked for: the CONNECT's user stands for the request.
        let inside = Self.admit("GET /img.png HTTP/1.1\r\nHost: a.example\r\n\r\n",
                                source: .intercepted(InterceptedOrigin(host: "a.example", port: 443, proxyUser: "alice")),
                                settings: settings)
        #expect(Self.summary(inside) == "forward https://a.example/img.png")
        #expect(inside.proxyUser == "alice")
    }

    @Test func insideAnInterceptedTunnelOnlyItsOriginIsReachable() throws {
        let settings = try Self.settings("")
        let source = RequestSource.intercepted(InterceptedOrigin(host: "a.example", port: 8443))
        let rows: [(String, String)] = [
            ("GET /x HTTP/1.1\r\nHost: a.example:8443\r\n\r\n", "forward https://a.example:8443/x"),
            ("GET /x HTTP/1.1\r\nHost: b.example:8443\r\n\r\n", "refuse misdirected-request"),
            ("GET https://b.example:8443/x HTTP/1.1\r\nHost: b.example:8443\r\n\r\n", "refuse misdirected-request"),
            ("CONNECT b.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n", "refuse bad-request close"),
        ]
        for (request, expected) in rows {
            #expect(Self.summary(Self.admit(request, source: source, settings: settings)) == expected, "\(request.debugDescription)")
        }
    }

    @Test func thePolicyDecidesUnderTheModeAndVariantsReplaceRefusals() throws {
        let yaml = """
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            variants:
              - id: hero-small
                match: "http://cdn.example/img/*.jpg"
                target: "http://cdn.example/img/$1@small.jpg"
            """
        let constrained = try Self.settings(yaml, mode: DataMode(constrained: true, expensive: false))
        let video = Self.admit("GET http://cdn.example/a.mp4 HTTP/1.1\r\nHost: cdn.example\r\n\r\n", settings: constrained)
        #expect(Self.summary(video) == "reject constrained")
        #expect(video.rule == "videos")
        #expect(video.url == "http://cdn.example/a.mp4")
        let image = Self.admit("GET http://cdn.example/img/hero.jpg HTTP/1.1\r\nHost: cdn.example\r\nAllow-Constrained: ?0\r\n\r\n",
                               settings: constrained)
        #expect(Self.summary(image) == "variant hero-small")
        let invalid = Self.admit("GET http://cdn.example/x HTTP/1.1\r\nHost: cdn.example\r\nAllow-Constrained: maybe\r\n\r\n",
                                 settings: constrained)
        #expect(Self.summary(invalid) == "refuse invalid-tag")
        // The same video under no mode is forwarded.
        let normal = try Self.settings(yaml)
        #expect(Self.summary(Self.admit("GET http://cdn.example/a.mp4 HTTP/1.1\r\nHost: cdn.example\r\n\r\n", settings: normal))
            == "forward http://cdn.example/a.mp4")
    }

    @Test func spentBudgetsJoinTheirConditionsOrRefuse() throws {
        let yaml = """
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            budgets:
              - {name: daily, bytes: 1GB, period: day, then: constrained}
              - {name: cdn, bytes: 1GB, period: day, match: {host: "cdn.example"}, then: reject}
            """
        let settings = try Self.settings(yaml)
        let configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: "/")
        let all = configuration.budgets
        let video = "GET http://a.example/a.mp4 HTTP/1.1\r\nHost: a.example\r\n\r\n"
        #expect(Self.summary(Self.admit(video, settings: settings, budgets: Budgets(budgets: all))) == "forward http://a.example/a.mp4")
        let joined = Self.admit(video, settings: settings, budgets: Budgets(budgets: all, spent: [0]))
        #expect(Self.summary(joined) == "reject constrained budget=daily")
        #expect(joined.budgetMask == 0b01)
        let cdn = Self.admit("GET http://cdn.example/x HTTP/1.1\r\nHost: cdn.example\r\n\r\n", settings: settings,
                             budgets: Budgets(budgets: all, spent: [1]))
        #expect(Self.summary(cdn) == "budget-exhausted 1")
        #expect(cdn.budgetMask == 0b11)
    }

    @Test func aRefusalSaysWhenASpentBudgetsPeriodEndsOrAScheduleStepLiftsIt() throws {
        let yaml = """
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            budgets:
              - {name: daily, bytes: 1GB, period: day, then: constrained}
              - {name: cdn, bytes: 1GB, period: day, match: {host: "cdn.example"}, then: reject}
            """
        let configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: "/")
        let settings = try Self.settings(yaml)
        let video = "GET http://a.example/a.mp4 HTTP/1.1\r\nHost: a.example\r\n\r\n"
        let spent = Budgets(budgets: configuration.budgets, spent: [0, 1], periodEnds: [0: 500, 1: 800])
        let joined = Self.admit(video, settings: settings, budgets: spent)
        #expect(joined.lift?.at == 500_000_000_000 && joined.lift?.retryAfterSeconds == 500)
        #expect(joined.lift?.cause == .budgetPeriod("daily"))
        // Both budgets hold the CDN: it is let through when the later one ends.
        let cdn = Self.admit("GET http://cdn.example/a.mp4 HTTP/1.1\r\nHost: cdn.example\r\n\r\n", settings: settings,
                             budgets: spent)
        #expect(Self.summary(cdn) == "budget-exhausted 1")
        #expect(cdn.lift?.at == 800_000_000_000 && cdn.lift?.retryAfterSeconds == 800)

        // Under a constrained mode with a schedule on the global scope: its step to normal lifts it.
        var snapshot = RuntimeSnapshot(configuration: configuration,
                                       policy: try ConfigurationSnapshot(configuration: configuration).policy,
                                       mode: .constrained, modeSource: .default, modeSince: 0)
        snapshot.scheduleOutlooks[""] = ScheduleOutlook(steps: [ScheduleStep(after: .seconds(5), mode: .normal)],
                                                        repeats: false, next: 0, nextAt: 12_500_000_000)
        let stepped = Self.admit(video, settings: WorkerSettings(snapshot))
        #expect(Self.summary(stepped) == "reject constrained")
        #expect(stepped.lift?.at == 12_500_000_000 && stepped.lift?.retryAfterSeconds == 13 && stepped.lift?.cause == .schedule)
        // Nothing known lifts it without the schedule.
        #expect(Self.admit(video, settings: try Self.settings(yaml, mode: .constrained)).lift == nil)
    }

    @Test func sessionsReplaceTheModeAndAnUnknownOneIsRefused() throws {
        let settings = try Self.settings("sessions: {enabled: true}")
        let unknown = Self.admit("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nData-Mode-Session: nope\r\n\r\n",
                                 settings: settings)
        #expect(Self.summary(unknown) == "refuse unknown-session")
    }
}
