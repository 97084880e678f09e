import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The members of a problem document that the proxy writes (SPEC §4, §6).
public struct ProblemDocument: Decodable, Sendable, Hashable {
    public var type: String?
    public var title: String?
    public var status: Int?
    public var error: String?
    public var detail: String?
    public var reasons: [String]?
    public var mode: String?
    public var url: String?
}
