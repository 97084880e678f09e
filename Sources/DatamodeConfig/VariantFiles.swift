import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where a file variant may be served from (SPEC §5 `variants-dir`), and the check every `file` passes when its
/// variant is declared: in the config file, through `PUT /variants/{id}`, or read back from the state directory.
///
/// A file variant's bytes go to anyone who can request the matched URL, so `file` is a read capability on the
/// proxy's file system, and the admin API has no token by default. Confining it to one directory the operator
/// chose keeps `"file": "../../../../etc/passwd"`, `/etc/shadow` or a symbolic link planted to point there from
/// turning the proxy into a file server. Only a regular file is accepted: opening a FIFO blocks until a writer
/// appears, and a device can block or never end, either of which would stall the worker that serves it.
///
/// Checking here is not enough on its own (the file can be swapped after it was declared); the engine opens it
/// non-blocking, without following a final symbolic link, and serves it only if it is still a regular file.
public struct VariantFiles: Sendable, Equatable {
    /// Where a relative `file` is resolved: the config file's directory, or the working directory without one.
    public var baseDirectory: String
    /// The variants directory as an absolute path (symbolic links not resolved yet: it may not exist).
    public var directory: String

    public init(baseDirectory: String, directory: String) {
        self.baseDirectory = baseDirectory
        self.directory = directory
    }

    /// Why a `file` is refused; `description` completes "variant "id": …".
    public enum Problem: Error, Equatable, CustomStringConvertible {
        /// The variants directory does not exist or is not a directory.
        case noDirectory(directory: String)
        /// Nothing at the path (or a symbolic link to nothing).
        case missing(written: String, path: String)
        /// The real path is not below the variants directory.
        case outside(written: String, resolved: String, directory: String)
        /// Inside, but a FIFO, a device, a directory or a socket.
        case notRegular(resolved: String, kind: String)
        /// Inside and regular, but the proxy cannot read it.
        case unreadable(resolved: String)
        /// A name no file has: empty, with a NUL byte (C would cut it there), or ending in `/` (a directory's).
        case malformed(written: String, why: String)

        public var description: String {
            switch self {
            case .noDirectory(let directory):
                "the variants directory \(quoted(directory)) does not exist "
                    + "(variants-dir; default: variants/ beside the config file); a file variant must be inside it"
            case .missing(_, let path):
                "file \(quoted(path)) does not exist"
            case .outside(let written, let resolved, let directory):
                "file \(quoted(written)) resolves to \(quoted(resolved)), outside the variants directory "
                    + "\(quoted(directory)) (variants-dir)"
            case .notRegular(let resolved, let kind):
                "\(quoted(resolved)) is not a regular file (it is \(kind))"
            case .malformed(let written, let why):
                "file \(quoted(written)) is not a file name: \(why)"
            case .unreadable(let resolved):
                "file \(quoted(resolved)) is not readable"
            }
        }
    }

    /// The real path (absolute, no `.` or `..`, no symbolic links) of the regular file that `written` names,
    /// provided it lies inside the (real) variants directory. A relative `written` is taken from `baseDirectory`.
    public func resolve(_ written: String) -> Result<String, Problem> {
        if written.isEmpty { return .failure(.malformed(written: written, why: "it is empty")) }
        if written.utf8.contains(0) { return .failure(.malformed(written: written, why: "it contains a NUL byte")) }
        if written.hasSuffix("/") { return .failure(.malformed(written: written, why: "it ends with / (a directory)")) }
        let path = ProxyConfiguration.absolutePath(written.hasPrefix("/") ? written : baseDirectory + "/" + written)
        guard let realDirectory = Self.realPath(directory), Self.isDirectory(realDirectory) else {
            return .failure(.noDirectory(directory: directory))
        }
        guard let resolved = Self.realPath(path) else {
            return .failure(.missing(written: written, path: path))
        }
        let inside = realDirectory == "/" || resolved.hasPrefix(realDirectory + "/") || resolved == realDirectory
        guard inside else {
            return .failure(.outside(written: written, resolved: resolved, directory: realDirectory))
        }
        var info = stat()
        guard stat(resolved, &info) == 0 else { return .failure(.missing(written: written, path: path)) }
        let kind: String
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            guard access(resolved, R_OK) == 0 else { return .failure(.unreadable(resolved: resolved)) }
            return .success(resolved)
        case S_IFDIR: kind = "a directory"
        case S_IFIFO: kind = "a FIFO"
        case S_IFCHR: kind = "a character device"
        case S_IFBLK: kind = "a block device"
        case S_IFSOCK: kind = "a socket"
        default: kind = "of an unknown file type"
        }
        return .failure(.notRegular(resolved: resolved, kind: kind))
    }

    /// `realpath(3)`: nil when the path (or a link on the way) does not resolve.
    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }
}
