import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A fresh private directory under the system temporary directory, for one test's files.
public enum ScratchDirectory {
    /// Creates `<tmp>/<prefix>-<random>` and returns its path.
    public static func make(_ prefix: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Removes it and everything in it (errors ignored: a leftover temporary directory is harmless).
    public static func remove(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }
}
