@testable import DatamodeDeferral
import DatamodeHTTP
import Dispatch
import Foundation
import Synchronization

/// A private directory for one test's store, removed by `remove()`.
struct StoreDirectory {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("deferral-tests-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    var database: String { path + "/" + DeferredStore.fileName }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Waits for a store operation's completion and returns its result (tests only: the engine never waits).
func waitFor<T: Sendable>(_ start: (@escaping @Sendable (Result<T, DeferredStoreError>) -> Void) -> Void)
    -> Result<T, DeferredStoreError> {
    let box = Mutex<Result<T, DeferredStoreError>?>(nil)
    let done = DispatchSemaphore(value: 0)
    start { result in
        box.withLock { $0 = result }
        done.signal()
    }
    if done.wait(timeout: .now() + 30) == .timedOut { return .failure(.io(path: "", detail: "the completion never came")) }
    return box.withLock { $0! }
}

/// An upload of `size` patterned bytes to `url`.
func upload(_ size: Int = 1000, url: String = "http://origin.example/upload", headers: [HTTPField] = [],
            session: String? = nil, seed: UInt8 = 1) -> DeferredUpload {
    let body = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed)) }
    return DeferredUpload(method: "POST", url: url, headers: headers, body: body, session: session)
}

extension DeferredDatabase {
    /// The whole body of a live entry.
    func body(_ id: String) throws -> [UInt8] {
        try readBody(id, offset: 0, count: Int.max / 2)
    }
}

/// The error `body` throws, or nil when it returns.
func failure<T>(_ body: () throws(DeferredStoreError) -> T) -> DeferredStoreError? {
    do throws(DeferredStoreError) {
        _ = try body()
        return nil
    } catch {
        return error
    }
}
