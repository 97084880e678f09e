import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A response body produced piecewise, never held whole (50 MiB tests).
public struct BodyGenerator: Sendable {
    public let length: UInt64
    private let fill: @Sendable (UInt64, UnsafeMutableRawBufferPointer) -> Void

    /// `fill(offset, buffer)` writes the bytes at `offset ..< offset + buffer.count`.
    public init(length: UInt64, fill: @escaping @Sendable (UInt64, UnsafeMutableRawBufferPointer) -> Void) {
        self.length = length
        self.fill = fill
    }

    public init(_ pattern: PatternBody) {
        self.init(length: pattern.length) { offset, buffer in pattern.fill(offset: offset, into: buffer) }
    }

    func write(offset: UInt64, into buffer: UnsafeMutableRawBufferPointer) { fill(offset, buffer) }
}
