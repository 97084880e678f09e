import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Waiting for something that becomes true asynchronously (a counter the workers bump after the response was
/// written, a connection the proxy notices closing) without asserting anything about how long it takes:
/// the deadline only bounds a test that would otherwise hang.
public enum AdminPolling {
    /// Calls `condition` until it returns true or `timeout` passes; returns its last answer.
    @discardableResult
    public static func until(timeout: Duration = .seconds(10), interval: Duration = .milliseconds(10),
                             _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            if try condition() { return true }
            if ContinuousClock.now >= deadline { return false }
            Thread.sleep(forTimeInterval: Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
        }
    }
}

/// The state files of a state directory as they are on disk: bytes and identity (a rename gives a new inode),
/// to show that something did or did not rewrite them.
public struct StateFileSnapshot: Equatable, Sendable, CustomStringConvertible {
    public struct Entry: Equatable, Sendable {
        public var bytes: [UInt8]
        public var inode: UInt64
        public var modifiedNanoseconds: Int64
    }

    /// Every regular file of the directory by name.
    public var files: [String: Entry]

    public init(directory: String) {
        var files: [String: Entry] = [:]
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        for name in names {
            let path = directory + "/" + name
            var info = stat()
            guard stat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { continue }
            let bytes = FileManager.default.contents(atPath: path).map { Array($0) } ?? []
            files[name] = Entry(bytes: bytes, inode: UInt64(info.st_ino),
                                modifiedNanoseconds: Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec))
        }
        self.files = files
    }

    public var description: String {
        files.keys.sorted().map { "\($0) (\(files[$0]!.bytes.count) bytes, inode \(files[$0]!.inode))" }.joined(separator: ", ")
    }
}
