import DatamodeHTTP
import DatamodePolicy
@testable import DatamodeEngine
import Testing

/// The request head forwarded to a stream of an origin's HTTP/2 connection goes in memory (`ForwardedHead.head`,
/// `HTTP2OriginStream.take`) where any other connection gets its text (`ForwardedHead.text`), which the stream would
/// parse back; one function writes both. The stream must get exactly the head its parser would read from the text
/// (fields, order, values, the proxy's own Via, tags, Save-Data, framing), the text's length charged for it, and a
/// head its parser would refuse must still go as the text, to be refused.
@Suite struct ForwardedHeadTests {
    static let client = RequestHead(method: "POST", target: "http://example.com/upload?x=1", version: .http11, fields: [
        HTTPField(name: "Host", value: "example.com"),
        HTTPField(name: "User-Agent", value: "test/1.0"),
        HTTPField(name: "Connection", value: "x-hop, keep-alive, upgrade"),
        HTTPField(name: "X-Hop", value: "1"),
        HTTPField(name: "Keep-Alive", value: "timeout=5"),
        HTTPField(name: "Upgrade", value: "websocket"),
        HTTPField(name: "Transfer-Encoding", value: "chunked"),
        HTTPField(name: "Content-Length", value: "12"),
        HTTPField(name: "If-None-Match", value: "\"a\""),
        HTTPField(name: "If-Range", value: "\"a\""),
        HTTPField(name: "Range", value: "bytes=0-9"),
        HTTPField(name: "Save-Data", value: "off"),
        HTTPField(name: "Allow-Constrained", value: "?1"),
        HTTPField(name: "Accept", value: "image/webp,  */*"),
        HTTPField(name: "Via", value: "1.1 elsewhere"),
        HTTPField(name: "Cookie", value: "a=b; c=\"d e\""),
    ])

    static func forwarded(_ head: RequestHead, upgrade: Bool = false, framing: BodyFraming = .none,
                          mode: DataMode = [], settings: TagSettings = TagSettings(), variantTarget: Bool = false,
                          asHead: Bool) -> ForwardedHead {
        guard case .success(let target) = RequestTarget.parse(head.target, method: head.method) else {
            preconditionFailure("a test target must parse")
        }
        return MessageHeads.forwardedRequest(head, target: target, tags: RequestTags(allowConstrained: true, allowExpensive: false),
                                             settings: settings, mode: mode, upgrade: upgrade, framing: framing,
                                             connectionTokens: head.connectionTokens, variantTarget: variantTarget,
                                             asHead: asHead)
    }

    /// What the stream gets either way: the head handed over, and the head its parser reads from the text (with the
    /// text's length), or nil when the handoff declines it.
    static func bothWays(_ text: ForwardedHead, _ handed: ForwardedHead) -> (text: [UInt8], handed: RequestHead)? {
        guard case .text(let bytes) = text, case .head(let head) = handed else {
            Issue.record("asHead must choose the form")
            return nil
        }
        return (bytes, head)
    }

    @Test(arguments: [false, true], [false, true])
    func theHandedHeadIsTheHeadTheStreamParsesFromTheText(upgrade: Bool, variantTarget: Bool) {
        let framings: [BodyFraming] = [.none, .contentLength(12), .chunked, .untilClose]
        let modes: [DataMode] = [[], .constrained, [.constrained, .expensive]]
        let settings = [TagSettings(), TagSettings(forward: false, saveData: false)]
        for framing in framings {
            for mode in modes {
                for tagSettings in settings {
                    let what = "framing \(framing) mode \(mode) settings \(tagSettings)"
                    guard let (text, head) = Self.bothWays(
                        Self.forwarded(Self.client, upgrade: upgrade, framing: framing, mode: mode, settings: tagSettings,
                                       variantTarget: variantTarget, asHead: false),
                        Self.forwarded(Self.client, upgrade: upgrade, framing: framing, mode: mode, settings: tagSettings,
                                       variantTarget: variantTarget, asHead: true)) else { return }
                    // A retry on a new connection writes the handed head as text: the same bytes.
                    #expect(head.serialized() == text, "\(what)")
                    let limits = HTTP2OriginStream.requestLimits
                    let parsed = text.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
                    guard case .complete(let back, let length) = parsed else {
                        Issue.record("the text does not parse: \(parsed), \(what)")
                        continue
                    }
                    #expect(back == head, "\(what)")
                    #expect(length == text.count)
                    #expect(HTTP2OriginStream.handedLength(of: head) == length, "\(what)")
                }
            }
        }
    }

    /// Heads at and just past each of the stream's limits (request line, field count, header section), and heads the
    /// parser refuses or reads back changed: handed only when the stream's parser reads the same head back from the
    /// text, with that length; anything else is declined, so written as the text and answered by the parser. The
    /// limits are what `handedLength` checks (a forwarded head's parts are known good, `HandoffSourceTests`); the
    /// bytes the parser refuses are `HeadHandoff`'s own checks, with the same limits.
    @Test func atTheStreamsLimitsTheHandoffAgreesWithTheParser() {
        let limits = HTTP2OriginStream.requestLimits
        var heads: [(String, RequestHead)] = []
        // "GET " + target + " HTTP/1.1" is the request line.
        for extra in [-1, 0, 1] {
            let target = "/" + String(repeating: "t", count: limits.requestLine - 14 + extra)
            heads.append(("request line \(extra)", RequestHead(method: "GET", target: target, version: .http11,
                                                                 fields: [HTTPField(name: "Host", value: "h")])))
        }
        for count in [limits.headerCount - 1, limits.headerCount, limits.headerCount + 1] {
            let fields = (0..<count).map { HTTPField(name: "x-f\($0)", value: "v") }
            heads.append(("\(count) fields", RequestHead(method: "GET", target: "/", version: .http11, fields: fields)))
        }
        for extra in [-1, 0, 1] {
            // One field filling the section (its final CRLF included) to its limit, plus `extra`.
            let value = String(repeating: "v", count: limits.headerSection - 2 - 4 - 6 + extra)
            heads.append(("section \(extra)", RequestHead(method: "GET", target: "/", version: .http11,
                                                           fields: [HTTPField(name: "x-fill", value: value)])))
        }
        // Fields the parser would refuse or change: not a token, a CR, leading or trailing whitespace, an empty name.
        for field in [HTTPField(name: "x y", value: "1"), HTTPField(name: "x", value: "a\rb"),
                      HTTPField(name: "x", value: " padded"), HTTPField(name: "x", value: "padded\t"),
                      HTTPField(name: "", value: "1"), HTTPField(name: "x", value: "a\nb: c")] {
            heads.append(("field \(field)", RequestHead(method: "GET", target: "/", version: .http11, fields: [field])))
        }
        heads.append(("method", RequestHead(method: "G T", target: "/", version: .http11, fields: [])))
        heads.append(("target", RequestHead(method: "GET", target: "/a b", version: .http11, fields: [])))
        heads.append(("empty target", RequestHead(method: "GET", target: "", version: .http11, fields: [])))
        heads.append(("version", RequestHead(method: "GET", target: "/", version: HTTPVersion(major: 2, minor: 0), fields: [])))

        var handed = 0, declined = 0
        for (what, head) in heads {
            let text = Self.text(head)
            let parsed = text.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
            let readBack: (RequestHead, Int)?
            if case .complete(let back, let length) = parsed, length <= limits.maxRequestHeadBytes {
                readBack = (back, length)
            } else {
                readBack = nil
            }
            let partsAreGood = HeadHandoff.request(head, limits: HTTPLimits(requestLine: 1 << 20, headerSection: 1 << 20,
                                                                            headerCount: 1 << 20),
                                                   maxHeadBytes: 1 << 21) != nil
            let handedLength = partsAreGood ? HTTP2OriginStream.handedLength(of: head)
                : HeadHandoff.request(head, limits: limits, maxHeadBytes: limits.maxRequestHeadBytes)
            if let length = handedLength {
                handed += 1
                #expect(readBack?.0 == head && readBack?.1 == length, "\(what): handed, but the parser reads \(parsed)")
            } else {
                declined += 1
            }
        }
        // Both sides of each limit were reached: the three just below handed, the three just past and the ten the
        // parser refuses or changes declined.
        #expect(handed >= 3 && declined >= 13, "handed \(handed), declined \(declined)")
    }

    /// The text as written, without `HeadWriter`'s checks (a head the writer would never make is still text).
    static func text(_ head: RequestHead) -> [UInt8] {
        var text = Array("\(head.method) \(head.target) HTTP/\(head.version.major).\(head.version.minor)\r\n".utf8)
        for field in head.fields { text += Array("\(field.name): \(field.value)\r\n".utf8) }
        return text + Array("\r\n".utf8)
    }
}
