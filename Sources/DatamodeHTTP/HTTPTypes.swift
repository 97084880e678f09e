/// Value types of an HTTP/1.1 message head as this proxy sees it on the wire (RFC 9112).
///
/// Parsing lives in `HTTP1Parser`, body framing in `BodyFraming`, chunked framing in `ChunkedDecoder`,
/// writing in `HeadWriter`. Everything here is pure Swift: no I/O, no C, so it can be fuzzed and tested in isolation.

/// `HTTP/major.minor`. Requests accept 1.0 and 1.1 only; responses accept any 1.x.
public struct HTTPVersion: Hashable, Sendable, CustomStringConvertible {
    public var major: UInt8
    public var minor: UInt8
    public init(major: UInt8, minor: UInt8) {
        self.major = major
        self.minor = minor
    }
    public static let http10 = HTTPVersion(major: 1, minor: 0)
    public static let http11 = HTTPVersion(major: 1, minor: 1)
    public var description: String { "HTTP/\(major).\(minor)" }
}

/// One header field line. `name` keeps the client's spelling; `value` has leading and trailing
/// whitespace (OWS, RFC 9110 §5.6.3) removed.
public struct HTTPField: Hashable, Sendable {
    public var name: String
    public var value: String
    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

/// Size limits applied while parsing a head (SPEC §6 defaults).
public struct HTTPLimits: Hashable, Sendable {
    /// Longest request line (or status line), CRLF excluded. Longer: `.requestLineTooLong` (414).
    public var requestLine: Int
    /// Longest header section: everything after the start line up to and including the final CRLF. Larger: 431.
    public var headerSection: Int
    /// Most header field lines. More: 431.
    public var headerCount: Int
    public init(requestLine: Int = 8 * 1024, headerSection: Int = 64 * 1024, headerCount: Int = 100) {
        self.requestLine = requestLine
        self.headerSection = headerSection
        self.headerCount = headerCount
    }

    /// The most bytes a request head can take under these limits: leading empty lines, request line and CRLF,
    /// header section. A parser given this many bytes has either a whole head or an exceeded limit, so an
    /// in-place parse never needs to look further (the engine's window, its differential test, the fuzz target).
    public var maxRequestHeadBytes: Int {
        2 * HTTP1Parser.maxLeadingEmptyLines + requestLine + 2 + headerSection
    }
}

/// A parsed request head.
public struct RequestHead: Hashable, Sendable {
    public var method: String
    /// The request-target exactly as sent (RFC 9112 §3.2); see `RequestTarget` for its parsed form.
    public var target: String
    public var version: HTTPVersion
    public var fields: [HTTPField]
    public init(method: String, target: String, version: HTTPVersion, fields: [HTTPField]) {
        self.method = method
        self.target = target
        self.version = version
        self.fields = fields
    }
}

/// A parsed response head.
public struct ResponseHead: Hashable, Sendable {
    public var version: HTTPVersion
    public var status: Int
    public var reason: String
    public var fields: [HTTPField]
    public init(version: HTTPVersion, status: Int, reason: String, fields: [HTTPField]) {
        self.version = version
        self.status = status
        self.reason = reason
        self.fields = fields
    }
}

/// Why bytes on the wire were refused. Each case maps to one stable error code of SPEC §6
/// (the mapping lives in `ProxyErrorCode` of DatamodePolicy, via the engine).
public enum HTTPWireError: Error, Hashable, Sendable {
    /// Malformed or ambiguous syntax or framing: 400 `bad-request` (from a client) or
    /// 502 `upstream-protocol-error` (from an origin). The string says what, for the problem detail.
    case malformed(String)
    /// The request line is longer than `HTTPLimits.requestLine`: 414 `uri-too-long`.
    case requestLineTooLong
    /// The header section is larger than `HTTPLimits.headerSection` or has more than `headerCount` lines:
    /// 431 `headers-too-large`.
    case headerSectionTooLarge
}

/// The result of trying to parse a head from the bytes buffered so far.
public enum HeadParseResult<Head: Sendable>: Sendable {
    /// No violation is visible yet and no limit is exceeded: wait for more bytes.
    case incomplete
    /// A whole head; `length` bytes (including any leading empty lines and the final CRLF) were used.
    case complete(Head, length: Int)
    /// The bytes can never become a valid head.
    case invalid(HTTPWireError)
}

/// How the body of a message is delimited (RFC 9112 §6.3).
public enum BodyFraming: Hashable, Sendable {
    /// No body at all.
    case none
    /// Exactly this many bytes follow.
    case contentLength(UInt64)
    /// Chunked transfer coding; see `ChunkedDecoder`.
    case chunked
    /// Responses only: the body runs until the origin closes the connection.
    case untilClose
}
