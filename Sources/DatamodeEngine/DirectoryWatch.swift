import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// Tells the control loop when entries of one directory change (SPEC §19 `store.kind: file`): another process
/// wrote the state directory.
///
/// It watches the directory, not the files in it: a file replaced by a rename (the atomic write every careful
/// writer does) is a new inode that a watch on the old one would never see, and a Kubernetes ConfigMap volume
/// changes by swapping its `..data` symlink, which only the directory sees (a `IN_MOVED_TO` of `..data`). The
/// handler gets the names the kernel reported; the caller decides which matter and re-reads those files.
///
/// inotify's queue can overflow (`IN_Q_OVERFLOW`, reported with no name): the handler then gets `nil`, meaning
/// "anything may have changed".
public final class DirectoryWatch {
    public let directory: String
    private let descriptor: Int32
    private var event: OpaquePointer?
    private let handler: ([String]?) -> Void

    /// Watches `directory` on `loop`; `handler` runs on the loop's thread after each batch of changes. Throws when
    /// inotify cannot be used (no instance or watch left: `fs.inotify.max_user_*`), naming the reason.
    public init(loop: ControlLoop, directory: String, handler: @escaping ([String]?) -> Void) throws(EngineError) {
        self.directory = directory
        self.handler = handler
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { throw EngineError("inotify_init1: \(String(cString: strerror(errno)))") }
        // Creation, removal, renames in or out, a file written and closed, and a changed symlink or mode bits.
        let mask = UInt32(IN_CREATE) | UInt32(IN_DELETE) | UInt32(IN_MOVED_FROM) | UInt32(IN_MOVED_TO)
            | UInt32(IN_CLOSE_WRITE) | UInt32(IN_ATTRIB) | UInt32(IN_ONLYDIR)
        guard inotify_add_watch(fd, directory, mask) >= 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw EngineError("inotify_add_watch \(directory): \(reason)")
        }
        descriptor = fd
        event = dm_read_event_new(loop.base, fd, directoryWatchCallback, context(self))
        event_add(event, nil)
    }

    deinit {
        if let event { event_free(event) }
        close(descriptor)
    }

    /// Reads every queued inotify record and hands the names over once.
    func readable() {
        var names: [String] = []
        var overflowed = false
        let capacity = 64 * 1024
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: MemoryLayout<inotify_event>.alignment)
        defer { buffer.deallocate() }
        while true {
            let count = read(descriptor, buffer, capacity)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            var offset = 0
            let header = MemoryLayout<inotify_event>.size
            while offset + header <= count {
                let record = (buffer + offset).assumingMemoryBound(to: inotify_event.self).pointee
                if record.mask & UInt32(IN_Q_OVERFLOW) != 0 { overflowed = true }
                if record.len > 0 {
                    let name = (buffer + offset + header).assumingMemoryBound(to: CChar.self)
                    names.append(String(cString: name))
                }
                offset += header + Int(record.len)
            }
        }
        handler(overflowed ? nil : names)
    }
}
