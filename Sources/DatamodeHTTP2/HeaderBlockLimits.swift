/// How large a header block the proxy sends a client (RFC 9113 §6.5.2, §10.5.1), checked before a head is
/// submitted, because past either of two limits nothing good follows:
/// - the client's `SETTINGS_MAX_HEADER_LIST_SIZE`: the header list size (each field's name and value plus 32 bytes)
///   it said it accepts. Advisory in RFC 9113, but a client that announced it refuses more (Python `h2` ends the
///   connection: every stream on it is lost);
/// - what the proxy sends in one header block (`maxSendHeaderBlock`, nghttp2's `max_send_header_block_length`, which
///   nghttp2 checks against its upper bound of the encoded block, `nghttp2_hd_deflate_bound`): nghttp2 does not send
///   a larger one, and drops a response's HEADERS without a word, leaving the stream open: the client waits for
///   ever.
/// A head past either is refused (`HTTP2SessionError.headerListTooLarge`) and the engine answers otherwise.
import CNghttp2
import DatamodeHTTP

extension HTTP2ServerSession {
    /// The largest header block the proxy sends (nghttp2's bound of its encoded size): the request section limit and
    /// room for the fields a relayed response gains.
    var maxSendHeaderBlock: Int { configuration.headerLimits.headerSection + 16 * 1024 }

    /// A header list size (RFC 9113 §6.5.2) no larger than this always goes out on this connection; a larger one
    /// may not (`headerListProblem` says).
    public var headerListLimit: Int { min(announcedHeaderListSize, maxSendHeaderBlock) }

    /// The client's `SETTINGS_MAX_HEADER_LIST_SIZE` (unlimited until it says).
    private var announcedHeaderListSize: Int {
        isDead ? Int(UInt32.max) : Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE))
    }

    /// Why a header block of `pseudo` (`:status`, or none for trailers) and `fields` cannot go out on this
    /// connection, or nil.
    public func headerListProblem(pseudo: [(String, String)], fields: [HTTPField]) -> String? {
        var size = 0
        // nghttp2_hd_deflate_bound: 12 bytes, then 12 per field besides its name and value.
        var bound = 12
        for (name, value) in pseudo {
            size += name.utf8.count + value.utf8.count + 32
            bound += name.utf8.count + value.utf8.count + 12
        }
        for field in fields {
            let count = field.name.utf8.count + field.value.utf8.count
            size += count + 32
            bound += count + 12
        }
        let announced = announcedHeaderListSize
        if size > announced {
            return "a header list of \(size) bytes, more than the \(announced) the client accepts (SETTINGS_MAX_HEADER_LIST_SIZE)"
        }
        if bound > maxSendHeaderBlock {
            return "a header block of up to \(bound) bytes, more than the \(maxSendHeaderBlock) the proxy sends in one"
                + " (limits.header-section plus 16 KiB)"
        }
        return nil
    }

    func checkHeaderList(pseudo: [(String, String)], fields: [HTTPField]) throws(HTTP2SessionError) {
        if let problem = headerListProblem(pseudo: pseudo, fields: fields) { throw .headerListTooLarge(problem) }
    }
}
