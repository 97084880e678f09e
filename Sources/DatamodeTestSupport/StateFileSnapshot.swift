import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The state files of a state directory as they are on disk: bytes and identity (a rename gives a new inode),
/// to show that something did or did not rewrite them.
public struct StateFileSnapshot: Equatable, Sendable, CustomStringConvertible {
    public struct Entry: Equatable, Sendable {
        public var bytes: [UInt8]
        public var inode: UInt64
        public var modifiedNanoseconds: Int64
    }

    /// Every regular file of the directory by name, except the deferral store's (`deferred.sqlite` and its `-wal`
    /// and `-shm`): a database open from start-up to shutdown whose pages SQLite manages (WAL, checkpoints) whatever
    /// the admin API is asked; what it holds is checked through `GET /deferred` (`DeferredUploadEndToEndTests`).
    public var files: [String: Entry]

    static func isDeferralStore(_ name: String) -> Bool {
        name == "deferred.sqlite" || name.hasPrefix("deferred.sqlite-")
    }

    public init(directory: String) {
        var files: [String: Entry] = [:]
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        for name in names where !Self.isDeferralStore(name) {
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
