/// An upload's body on its way into the store while the client still sends it (SPEC §6: a body is never held
/// whole; SPEC §18.3): `DeferredStore.appendBody` writes each piece to the body file as it comes, and
/// `enqueue(_:staged:now:completion:)` makes the file durable and commits the entry naming it, or
/// `discardBody` removes it. Its id is the entry's.
///
/// `@unchecked Sendable`: made on any thread, but its state is read and written on the store thread alone (every
/// operation that touches it runs there, one at a time).
public final class StagedBody: @unchecked Sendable {
    /// The entry id the body is stored under (its file's name).
    public let id: String
    /// The open body file, -1 before the first piece and after it was sealed or discarded.
    var fd: Int32 = -1
    /// Bytes written so far.
    var written = 0
    /// Why a piece could not be written: every later operation on it fails with this, and the file is gone.
    var failure: DeferredStoreError?
    /// Its entry was committed: the file is the entry's now, and `discardBody` leaves it.
    var committed = false

    init(id: String) {
        self.id = id
    }
}
