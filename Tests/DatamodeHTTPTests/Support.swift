import DatamodeHTTP

/// What a head parse came to, without the reason text (tests must not depend on wording).
enum Verdict: Hashable, Sendable, CustomStringConvertible {
    case incomplete
    case complete(length: Int)
    case malformed
    case requestLineTooLong
    case headerSectionTooLarge

    init(_ error: HTTPWireError) {
        switch error {
        case .malformed: self = .malformed
        case .requestLineTooLong: self = .requestLineTooLong
        case .headerSectionTooLarge: self = .headerSectionTooLarge
        }
    }

    init<H>(_ result: HeadParseResult<H>) {
        switch result {
        case .incomplete: self = .incomplete
        case .complete(_, let length): self = .complete(length: length)
        case .invalid(let error): self.init(error)
        }
    }

    var description: String {
        switch self {
        case .incomplete: "incomplete"
        case .complete(let l): "complete(\(l))"
        case .malformed: "malformed"
        case .requestLineTooLong: "requestLineTooLong"
        case .headerSectionTooLarge: "headerSectionTooLarge"
        }
    }
}

func parseRequest(_ bytes: [UInt8], limits: HTTPLimits = HTTPLimits()) -> HeadParseResult<RequestHead> {
    bytes.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
}

func parseRequest(_ text: String, limits: HTTPLimits = HTTPLimits()) -> HeadParseResult<RequestHead> {
    parseRequest(Array(text.utf8), limits: limits)
}

func parseResponse(_ bytes: [UInt8], limits: HTTPLimits = HTTPLimits()) -> HeadParseResult<ResponseHead> {
    bytes.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: limits) }
}

func parseResponse(_ text: String, limits: HTTPLimits = HTTPLimits()) -> HeadParseResult<ResponseHead> {
    parseResponse(Array(text.utf8), limits: limits)
}

/// The head of a complete parse, or nil.
func head<H>(_ result: HeadParseResult<H>) -> H? {
    if case .complete(let h, _) = result { return h }
    return nil
}

/// A request head with the given field lines (each "Name: value"), HTTP/1.1 unless told.
func request(_ fieldLines: [String], version: String = "HTTP/1.1", method: String = "POST",
             target: String = "http://example.com/") -> String {
    "\(method) \(target) \(version)\r\n" + fieldLines.map { $0 + "\r\n" }.joined() + "\r\n"
}

func requestHead(_ fieldLines: [String], version: String = "HTTP/1.1") -> RequestHead? {
    head(parseRequest(request(fieldLines, version: version)))
}

/// A named table row, so failures say which row.
struct Row<Input: Sendable, Expected: Sendable>: Sendable, CustomStringConvertible {
    var name: String
    var input: Input
    var expected: Expected
    init(_ name: String, _ input: Input, _ expected: Expected) {
        self.name = name
        self.input = input
        self.expected = expected
    }
    var description: String { name }
}
