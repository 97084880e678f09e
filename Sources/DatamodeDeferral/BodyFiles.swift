#if canImport(Glibc)
import Glibc
#endif

/// The directory beside the database that holds the bodies too large to keep in it (`DeferredStoreLimits.inlineBody`):
/// one file per entry, named by its id, readable only by the proxy's user.
///
/// The order that makes it crash-safe: a body file is written, fsync'd, and its name fsync'd (the directory)
/// before the entry that names it is committed, so a committed entry always has its whole body. A crash before
/// the commit leaves a file no entry names: `sweep` removes it at the next open. An entry's body file is
/// removed after the transaction that ended the entry; a crash in between leaves a file of a finished entry,
/// which `sweep` removes too.
///
/// A body still arriving (`StagedBody`, SPEC §6: never held whole) is written in pieces as it comes (`create`,
/// `append`), and made durable (`seal`) only once whole, just before its entry is committed: the same order, so
/// a crash mid-upload leaves a partial file no entry names, swept like any other.
struct BodyFiles {
    /// `<database>-bodies`.
    let directory: String
    /// Kept open to fsync the directory after each new file.
    private let directoryFD: Int32

    /// Opens the directory, creating it (and making its name durable) when missing.
    init(directory: String) throws(DeferredStoreError) {
        self.directory = directory
        if mkdir(directory, 0o700) == 0 {
            DeferredDatabase.syncDirectory(of: directory)
        } else if errno != EEXIST {
            throw .cannotOpen(path: directory, detail: String(cString: strerror(errno)))
        }
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw .cannotOpen(path: directory, detail: String(cString: strerror(errno))) }
        directoryFD = fd
    }

    func close() {
        _ = Glibc.close(directoryFD)
    }

    func path(_ id: String) -> String { directory + "/" + id }

    /// Writes `bytes` as `id`'s body and makes it durable (data, then name). On failure nothing is left behind.
    func write(_ id: String, _ bytes: [UInt8]) throws(DeferredStoreError) {
        let fd = try create(id)
        do throws(DeferredStoreError) {
            try append(id, fd, bytes)
        } catch {
            _ = Glibc.close(fd)
            remove(id)
            throw error
        }
        try seal(id, fd)
    }

    /// A new, empty body file for `id`, open for writing (not durable yet: `seal`).
    func create(_ id: String) throws(DeferredStoreError) -> Int32 {
        let fd = open(path(id), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure(path(id), errno) }
        return fd
    }

    /// Writes `bytes` at the end of `id`'s open body file `fd`. On failure the file is left to the caller.
    func append(_ id: String, _ fd: Int32, _ bytes: [UInt8]) throws(DeferredStoreError) {
        var problem: Int32 = 0
        bytes.withUnsafeBytes { raw in
            var written = 0
            while written < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + written, raw.count - written)
                if n < 0 {
                    if errno == EINTR { continue }
                    problem = errno
                    return
                }
                written += n
            }
        }
        guard problem == 0 else { throw failure(path(id), problem) }
    }

    /// Makes `id`'s body file durable (its data, then its name) and closes `fd`. On failure the file is removed.
    func seal(_ id: String, _ fd: Int32) throws(DeferredStoreError) {
        var problem: Int32 = 0
        if fsync(fd) != 0 { problem = errno }
        _ = Glibc.close(fd)
        if problem == 0 && fsync(directoryFD) != 0 { problem = errno }
        guard problem == 0 else {
            remove(id)
            throw failure(path(id), problem)
        }
    }

    /// Up to `count` bytes of `id`'s body from `offset`.
    func read(_ id: String, offset: Int, count: Int) throws(DeferredStoreError) -> [UInt8] {
        let path = path(id)
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .corrupt(path: path, detail: "the body file cannot be opened: \(String(cString: strerror(errno)))") }
        defer { _ = Glibc.close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw failure(path, errno) }
        let size = Int(info.st_size)
        let start = min(max(0, offset), size)
        let length = min(max(0, count), size - start)
        guard length > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: length)
        var done = 0
        var problem: Int32 = 0
        out.withUnsafeMutableBytes { raw in
            while done < length {
                let n = pread(fd, raw.baseAddress! + done, length - done, off_t(start + done))
                if n < 0 && errno == EINTR { continue }
                if n <= 0 {
                    problem = n < 0 ? errno : EIO
                    return
                }
                done += n
            }
        }
        guard problem == 0 else { throw failure(path, problem) }
        return out
    }

    /// Removes `id`'s body file, if it is there (a lost removal is swept at the next open).
    func remove(_ id: String) {
        unlink(path(id))
    }

    /// The size of `id`'s body file, nil when it is missing.
    func size(_ id: String) -> Int? {
        var info = stat()
        guard stat(path(id), &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int(info.st_size)
    }

    /// Removes every file named like an entry id that `keep` does not hold (left by a crash); returns how many.
    /// Files not named like ids are not the store's and are left alone.
    func sweep(keeping keep: Set<String>) -> Int {
        guard let dir = opendir(directory) else { return 0 }
        defer { closedir(dir) }
        var removed = 0
        while let entry = readdir(dir) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) {
                String(cString: UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self))
            }
            guard Self.isEntryID(name), !keep.contains(name) else { continue }
            if unlink(path(name)) == 0 { removed += 1 }
        }
        return removed
    }

    /// 22 characters of base64url (`DeferralRules.newID`).
    static func isEntryID(_ name: String) -> Bool {
        name.utf8.count == 22 && name.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
    }

    private func failure(_ path: String, _ code: Int32) -> DeferredStoreError {
        code == ENOSPC || code == EDQUOT ? .diskFull(path: directory) : .io(path: path, detail: String(cString: strerror(code)))
    }
}
