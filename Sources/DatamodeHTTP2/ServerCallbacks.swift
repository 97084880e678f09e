/// Every nghttp2 callback of `HTTP2ServerSession` enters Swift here (STYLE: the `Unmanaged` + `@convention(c)`
/// trampolines live in one file), and what each one decides is right below it.
///
/// nghttp2 calls these only from inside `nghttp2_session_mem_recv` / `mem_send`, i.e. from `receive` and
/// `writeOutput`, on the session's thread; `user_data` is the session, unretained (it owns nghttp2's session).
import CNghttp2
import DatamodeHTTP

enum ServerCallbacks {
    static func install(_ callbacks: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks) { _, hd, user in
            serverSession(user).beginFrame(hd!.pointee)
        }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, user in
            serverSession(user).beginHeaders(frame!.pointee)
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, user in
            serverSession(user).header(frame!.pointee, name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                 value: UnsafeRawBufferPointer(start: value, count: valueLength))
        }
        nghttp2_session_callbacks_set_on_invalid_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, user in
            serverSession(user).invalidHeader(frame!.pointee, name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                        value: UnsafeRawBufferPointer(start: value, count: valueLength))
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, user in
            serverSession(user).frameReceived(frame!.pointee)
        }
        nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks) { _, frame, libraryError, user in
            serverSession(user).invalidFrameReceived(frame!.pointee, libraryError: libraryError)
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, flags, id, data, length, user in
            serverSession(user).dataChunk(id, UnsafeRawBufferPointer(start: data, count: length))
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, id, code, user in
            serverSession(user).streamClosed(id, code: HTTP2ErrorCode(rawValue: code))
        }
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks) { _, frame, user in
            serverSession(user).frameSent(frame!.pointee)
        }
        nghttp2_session_callbacks_set_error_callback2(callbacks) { _, _, message, length, user in
            let text = UnsafeRawBufferPointer(start: message, count: length)
            serverSession(user).lastLibraryMessage = String(decoding: text, as: UTF8.self)
            return 0
        }
    }

    /// The response body's data source: copies queued bytes into nghttp2's frame buffer, as much as the windows
    /// and the frame allow; DEFERRED when the queue is empty and the body not finished (resumed by
    /// `sendResponseBody` / `finishResponse`); EOF when it is, with trailers sent from here as nghttp2 asks.
    static func responseBodyProvider() -> nghttp2_data_provider {
        var provider = nghttp2_data_provider()
        provider.read_callback = { raw, id, buffer, length, flags, _, user in
            serverSession(user).readResponseBody(raw, id, UnsafeMutableRawBufferPointer(start: buffer, count: length), flags!)
        }
        return provider
    }

}

/// The session behind nghttp2's `user_data`.
@inline(__always)
private func serverSession(_ user: UnsafeMutableRawPointer?) -> HTTP2ServerSession {
    Unmanaged<HTTP2ServerSession>.fromOpaque(user!).takeUnretainedValue()
}

/// Frame types and flags as nghttp2 reports them.
enum Frame {
    static let data = UInt8(NGHTTP2_DATA.rawValue)
    static let headers = UInt8(NGHTTP2_HEADERS.rawValue)
    static let rstStream = UInt8(NGHTTP2_RST_STREAM.rawValue)
    static let settings = UInt8(NGHTTP2_SETTINGS.rawValue)
    static let ping = UInt8(NGHTTP2_PING.rawValue)
    static let goaway = UInt8(NGHTTP2_GOAWAY.rawValue)
    static let continuation = UInt8(NGHTTP2_CONTINUATION.rawValue)
    static let endStream = UInt8(NGHTTP2_FLAG_END_STREAM.rawValue)
    static let ack = UInt8(NGHTTP2_FLAG_ACK.rawValue)
}

extension HTTP2ServerSession {
    // MARK: - Header blocks

    /// Every frame header, before its payload: the header block's CONTINUATION count and compressed size
    /// (CVE-2024-27316), and a new stream beyond the concurrency limit.
    func beginFrame(_ hd: nghttp2_frame_hd) -> Int32 {
        switch hd.type {
        case Frame.headers:
            headerBlock = HeaderBlock(stream: hd.stream_id, compressedBytes: hd.length, continuations: 0)
            if hd.stream_id & 1 == 1, hd.stream_id > lastClientStreamID {
                lastClientStreamID = hd.stream_id
                newStreamBegins(hd.stream_id)
            }
        case Frame.continuation:
            headerBlock.compressedBytes += hd.length
            headerBlock.continuations += 1
            if headerBlock.continuations > continuationLimit {
                terminate(.continuationFlood, code: .enhanceYourCalm,
                          detail: "more than \(continuationLimit) CONTINUATION frames after one HEADERS")
            }
        default:
            break
        }
        return 0
    }

    /// RFC 9113 §5.1.2: nghttp2 refuses a stream beyond `SETTINGS_MAX_CONCURRENT_STREAMS` with REFUSED_STREAM while
    /// the setting is unacknowledged, and ends the connection with PROTOCOL_ERROR once the client acknowledged it.
    /// The codec counts the same streams and acts first, so that either outcome carries its reason.
    private func newStreamBegins(_ id: HTTP2StreamID) {
        let acknowledged = nghttp2_session_get_local_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
        if openStreams >= Int(acknowledged) {
            terminate(.tooManyStreams, code: .protocolError,
                      detail: "stream \(id) opened beyond \(acknowledged) concurrent streams after SETTINGS ACK")
        } else if openStreams >= Int(configuration.maxConcurrentStreams) {
            events.append(.limitExceeded(.tooManyStreams))
            events.append(.requestRefused(id, .tooManyStreams))
            spendReset(detail: "stream \(id) refused")
        }
    }

    func beginHeaders(_ frame: nghttp2_frame) -> Int32 {
        let id = frame.hd.stream_id
        switch frame.headers.cat {
        case NGHTTP2_HCAT_REQUEST:
            openStreams += 1
            let stream = StreamState()
            stream.head = HTTP2RequestBuilder(part: .head, limits: configuration.headerLimits, scheme: configuration.scheme)
            streams[id] = stream
        case NGHTTP2_HCAT_HEADERS:
            guard streams[id] != nil else { return 0 }
            streams[id]!.trailers = HTTP2RequestBuilder(part: .trailers, limits: configuration.headerLimits,
                                                       scheme: configuration.scheme)
        default:
            break
        }
        return 0
    }

    func header(_ frame: nghttp2_frame, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Int32 {
        let id = frame.hd.stream_id
        guard let stream = streams[id] else { return 0 }
        let decoded: Int
        if frame.headers.cat == NGHTTP2_HCAT_REQUEST, stream.head != nil {
            stream.head!.add(name: name, value: value)
            decoded = stream.head!.decodedSize
        } else if stream.trailers != nil {
            stream.trailers!.add(name: name, value: value)
            decoded = stream.trailers!.decodedSize
        } else {
            return 0
        }
        // RFC 7541 §7.3: a few bytes of references to one large dynamic-table entry decode to megabytes. A section
        // past the limit is refused (431) either way; one that also outweighs its compressed size many times over
        // is an attack, and decoding the rest of it is work the connection does not get.
        let limit = configuration.headerLimits.headerSection
        if decoded > limit,
           decoded > configuration.floods.hpackBombRatio * headerBlock.compressedBytes + 8192 {
            terminate(.hpackBomb, code: .enhanceYourCalm,
                      detail: "\(headerBlock.compressedBytes) bytes of header block decoded to more than \(decoded)")
        }
        return 0
    }

    /// nghttp2 found a field it would otherwise drop silently (an invalid name character, a CR/LF/NUL or
    /// surrounding whitespace in a value). Dropping is not strict: a request is malformed or it is not. Returning
    /// TEMPORAL_CALLBACK_FAILURE makes nghttp2 reset the stream with PROTOCOL_ERROR (`nghttp2_session.c`,
    /// `inflate_header_block`).
    func invalidHeader(_ frame: nghttp2_frame, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Int32 {
        let id = frame.hd.stream_id
        if streams[id] != nil, streams[id]!.malformation == nil {
            let nameIsValid = !name.isEmpty && (name.first == UInt8(ascii: ":")
                ? name.dropFirst().allSatisfy(HTTP2RequestBuilder.isLowercaseTchar)
                : name.allSatisfy(HTTP2RequestBuilder.isLowercaseTchar))
            streams[id]!.malformation = nameIsValid
                ? .invalidFieldValue(name: String(decoding: name, as: UTF8.self)) : .invalidFieldName
        }
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
    }

    // MARK: - Frames

    func frameReceived(_ frame: nghttp2_frame) -> Int32 {
        let id = frame.hd.stream_id
        let endStream = frame.hd.flags & Frame.endStream != 0
        switch frame.hd.type {
        case Frame.headers:
            if frame.headers.cat == NGHTTP2_HCAT_REQUEST {
                requestHeadReceived(id, endStream: endStream)
            } else if frame.headers.cat == NGHTTP2_HCAT_HEADERS {
                trailersReceived(id)
            }
        case Frame.data:
            let payload = frame.hd.length - frame.data.padlen
            if payload == 0 && !endStream, !emptyFrameBudget.spend(now: now()) {
                terminate(.emptyFrames, code: .enhanceYourCalm, detail: "DATA frames without data, too many")
                return 0
            }
            if endStream { requestBodyEnded(id, trailers: []) }
        case Frame.rstStream:
            guard streams[id] != nil else { return 0 }
            let code = HTTP2ErrorCode(rawValue: frame.rst_stream.error_code)
            streams[id]!.end = streams[id]!.end ?? .resetByClient(code)
            // Only the streams the engine started work for count: a refused one was counted when refused.
            if case .open = streams[id]!.phase, !streams[id]!.responseEnded {
                spendReset(detail: "stream \(id) reset by the client")
            }
        case Frame.ping:
            if frame.hd.flags & Frame.ack == 0, !pingBudget.spend(now: now()) {
                terminate(.pingFlood, code: .enhanceYourCalm, detail: "PING frames faster than the budget")
            }
        case Frame.settings:
            if frame.hd.flags & Frame.ack == 0, !settingsBudget.spend(now: now()) {
                terminate(.settingsFlood, code: .enhanceYourCalm, detail: "SETTINGS frames faster than the budget")
            }
        case Frame.goaway:
            events.append(.goaway(lastStreamID: frame.goaway.last_stream_id,
                                  HTTP2ErrorCode(rawValue: frame.goaway.error_code)))
        default:
            break
        }
        return 0
    }

    /// The request's header section is complete: surface it or refuse it.
    private func requestHeadReceived(_ id: HTTP2StreamID, endStream: Bool) {
        guard streams[id] != nil, case .head = streams[id]!.phase, let builder = streams[id]!.head else { return }
        streams[id]!.head = nil
        switch builder.finish(endStream: endStream) {
        case .success(let request):
            streams[id]!.phase = .open
            streams[id]!.contentLength = request.contentLength
            streams[id]!.requestEnded = endStream
            events.append(.request(id, request, endStream: endStream))
        case .failure(let refusal):
            if refusal.awaitsResponse {
                streams[id]!.phase = .refused(awaitsResponse: true)
                streams[id]!.requestEnded = endStream
                events.append(.limitExceeded(.headerTooLarge))
                events.append(.requestRefused(id, refusal))
            } else {
                refuseMalformed(id, refusal)
                _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id,
                                              HTTP2ErrorCode.protocolError.rawValue)
            }
            spendReset(detail: "stream \(id) refused")
        }
    }

    private func refuseMalformed(_ id: HTTP2StreamID, _ refusal: HTTP2RequestRefusal) {
        streams[id]!.phase = .refused(awaitsResponse: false)
        streams[id]!.head = nil
        events.append(.requestRefused(id, refusal))
    }

    private func trailersReceived(_ id: HTTP2StreamID) {
        guard streams[id] != nil, let builder = streams[id]!.trailers else { return }
        streams[id]!.trailers = nil
        guard case .open = streams[id]!.phase else { return }
        switch builder.finish(endStream: true) {
        case .success(let trailers):
            requestBodyEnded(id, trailers: trailers.fields)
        case .failure:
            resetMalformed(id)
        }
    }

    /// END_STREAM from the client: the body is complete if it met `content-length` (RFC 9113 §8.1.1; nghttp2
    /// checks it too, and resets before this is called when it does not).
    private func requestBodyEnded(_ id: HTTP2StreamID, trailers: [HTTPField]) {
        if case .refused? = streams[id]?.phase {
            // Nothing to hand on; remembered so that no RST_STREAM(NO_ERROR) follows a response to it.
            streams[id]!.requestEnded = true
            return
        }
        guard let stream = streams[id], case .open = stream.phase, !stream.requestEnded, stream.end == nil else { return }
        if let length = stream.contentLength, length != stream.bodyReceived {
            resetMalformed(id)
            return
        }
        streams[id]!.requestEnded = true
        events.append(.requestEnd(id, trailers: trailers))
    }

    /// A surfaced stream whose DATA or trailers turned out malformed: PROTOCOL_ERROR, and the engine learns it
    /// from `streamClosed(.resetByProxy)`.
    private func resetMalformed(_ id: HTTP2StreamID) {
        streams[id]!.end = .resetByProxy(.protocolError)
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id,
                                      HTTP2ErrorCode.protocolError.rawValue)
        spendReset(detail: "stream \(id) reset for a malformed body")
    }

    /// nghttp2's own HTTP messaging checks refused a field or a request (it resets the stream with PROTOCOL_ERROR
    /// itself), or it found a protocol error (it sends GOAWAY itself).
    func invalidFrameReceived(_ frame: nghttp2_frame, libraryError: Int32) -> Int32 {
        let id = frame.hd.stream_id
        guard libraryError == NGHTTP2_ERR_HTTP_HEADER.rawValue || libraryError == NGHTTP2_ERR_HTTP_MESSAGING.rawValue,
              streams[id] != nil else { return 0 }
        switch streams[id]!.phase {
        case .head:
            let malformation = streams[id]!.malformation ?? .nghttp2(lastLibraryMessage.isEmpty
                ? HTTP2ServerSession.libraryError(libraryError) : lastLibraryMessage)
            refuseMalformed(id, .malformed(malformation))
            spendReset(detail: "stream \(id) refused")
        case .open:
            streams[id]!.end = streams[id]!.end ?? .resetByProxy(.protocolError)
            spendReset(detail: "stream \(id) reset for a malformed body")
        case .refused:
            break
        }
        return 0
    }

    func dataChunk(_ id: HTTP2StreamID, _ data: UnsafeRawBufferPointer) -> Int32 {
        guard let stream = streams[id], case .open = stream.phase, stream.end == nil, !stream.requestEnded else {
            // Nobody wants these bytes (a refused stream's body): they go back to the windows at once.
            _ = nghttp2_session_consume(session, id, data.count)
            return 0
        }
        let received = stream.bodyReceived + UInt64(data.count)
        streams[id]!.bodyReceived = received
        if let length = stream.contentLength, received > length {
            // nghttp2 resets before calling this; checked again so that no byte past content-length is surfaced.
            _ = nghttp2_session_consume(session, id, data.count)
            resetMalformed(id)
            return 0
        }
        streams[id]!.unconsumed += data.count
        connectionWindowWithheld += data.count
        events.append(.requestBody(id, Array(data)))
        return 0
    }

    func streamClosed(_ id: HTTP2StreamID, code: HTTP2ErrorCode) -> Int32 {
        guard let stream = streams.removeValue(forKey: id) else { return 0 }
        openStreams -= 1
        // Bytes the engine had not consumed yet still hold the connection window: give it back.
        let released = min(stream.unconsumed, connectionWindowWithheld)
        connectionWindowWithheld -= released
        connectionBytesToRelease += released
        let end: HTTP2StreamEnd
        if let known = stream.end {
            end = known
        } else if code == .noError && stream.responseEnded {
            end = .completed
        } else {
            end = .resetByProxy(code)
        }
        if end == .completed { resetBudget.earn() }
        if stream.engineKnows { events.append(.streamClosed(id, end)) }
        return 0
    }

    func frameSent(_ frame: nghttp2_frame) -> Int32 {
        let id = frame.hd.stream_id
        switch frame.hd.type {
        case Frame.headers, Frame.data:
            guard frame.hd.flags & Frame.endStream != 0, streams[id] != nil else { return 0 }
            streams[id]!.responseEnded = true
            // RFC 9113 §8.1: after a complete response to a request the proxy refused without reading, ask the
            // client to stop sending its body (RST_STREAM NO_ERROR) rather than discard it to the end.
            if case .refused = streams[id]!.phase, !streams[id]!.requestEnded {
                _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id,
                                              HTTP2ErrorCode.noError.rawValue)
            }
        case Frame.rstStream:
            guard streams[id] != nil else { return 0 }
            let code = HTTP2ErrorCode(rawValue: frame.rst_stream.error_code)
            if code == .noError && streams[id]!.responseEnded {
                streams[id]!.end = streams[id]!.end ?? .completed
            } else {
                streams[id]!.end = streams[id]!.end ?? .resetByProxy(code)
            }
        case Frame.goaway:
            let code = HTTP2ErrorCode(rawValue: frame.goaway.error_code)
            // nghttp2's own protocol errors end the connection with a GOAWAY the codec did not ask for.
            if code != .noError, connectionError == nil {
                let debug = frame.goaway.opaque_data_len > 0
                    ? String(decoding: UnsafeRawBufferPointer(start: frame.goaway.opaque_data,
                                                              count: frame.goaway.opaque_data_len), as: UTF8.self)
                    : lastLibraryMessage
                let error = HTTP2ConnectionError(cause: .protocolViolation, code: code, detail: debug)
                connectionError = error
                events.append(.connectionError(error))
            }
        default:
            break
        }
        return 0
    }

    // MARK: - Budgets

    /// A stream reset before it completed (CVE-2023-44487, and CVE-2025-8671 for those the proxy resets).
    func spendReset(detail: String) {
        if !resetBudget.spend(now: now()) {
            terminate(.rapidReset, code: .enhanceYourCalm, detail: "streams reset faster than they complete (\(detail))")
        }
    }

    // MARK: - Response bodies

    func readResponseBody(_ raw: OpaquePointer?, _ id: HTTP2StreamID, _ buffer: UnsafeMutableRawBufferPointer,
                          _ flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard streams[id]?.outbound != nil else {
            return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
        }
        // Out of the table while it changes, so the queue's storage stays uniquely owned (no copy on write).
        var body = streams[id]!.outbound!
        streams[id]!.outbound = nil
        defer { streams[id]!.outbound = body }
        let read = body.read(into: buffer, flags: flags, lowWatermark: configuration.responseBodyLowWatermark,
                             drained: { events.append(.responseBodyDrained(id)) },
                             submitTrailers: { trailers in
                                 Self.withNameValues(pseudo: [], fields: trailers) { list, count in
                                     nghttp2_submit_trailer(session, id, list, count)
                                 }
                             })
        // The last of what was queued before the engine's reset is in this frame: the reset follows it.
        if body.count == 0, let code = body.resetAfter {
            body.resetAfter = nil
            _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code)
        }
        return read
    }
}
