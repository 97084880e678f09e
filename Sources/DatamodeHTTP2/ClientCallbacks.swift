/// Every nghttp2 callback of `HTTP2ClientSession` enters Swift here, and what each decides is right below it.
/// nghttp2 calls them only from inside `receive` and `writeOutput`, on the session's thread.
import CNghttp2
import DatamodeHTTP

enum ClientCallbacks {
    static func install(_ callbacks: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, user in
            clientSession(user).beginHeaders(frame!.pointee)
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, user in
            clientSession(user).header(frame!.pointee, name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                       value: UnsafeRawBufferPointer(start: value, count: valueLength))
        }
        nghttp2_session_callbacks_set_on_invalid_header_callback(callbacks) { _, frame, name, nameLength, _, _, _, user in
            clientSession(user).invalidHeader(frame!.pointee, name: UnsafeRawBufferPointer(start: name, count: nameLength))
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, user in
            clientSession(user).frameReceived(frame!.pointee)
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, id, data, length, user in
            clientSession(user).dataChunk(id, UnsafeRawBufferPointer(start: data, count: length))
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, id, code, user in
            clientSession(user).streamClosed(id, code: HTTP2ErrorCode(rawValue: code))
        }
        nghttp2_session_callbacks_set_error_callback2(callbacks) { _, _, message, length, user in
            let text = UnsafeRawBufferPointer(start: message, count: length)
            clientSession(user).lastLibraryMessage = String(decoding: text, as: UTF8.self)
            return 0
        }
    }

    static func requestBodyProvider() -> nghttp2_data_provider {
        var provider = nghttp2_data_provider()
        provider.read_callback = { _, id, buffer, length, flags, _, user in
            clientSession(user).readRequestBody(id, UnsafeMutableRawBufferPointer(start: buffer, count: length), flags!)
        }
        return provider
    }
}

@inline(__always)
private func clientSession(_ user: UnsafeMutableRawPointer?) -> HTTP2ClientSession {
    Unmanaged<HTTP2ClientSession>.fromOpaque(user!).takeUnretainedValue()
}

extension HTTP2ClientSession {
    func beginHeaders(_ frame: nghttp2_frame) -> Int32 {
        let id = frame.hd.stream_id
        guard let stream = streams[id] else { return 0 }
        // Room for a typical head: growing from empty reallocated four or five times per response.
        stream.fields = []
        stream.fields.reserveCapacity(16)
        stream.status = nil
        stream.decodedSize = 0
        return 0
    }

    /// One response field: `:status` (the only pseudo-header nghttp2 lets through on a response), or a regular
    /// field checked as the proxy would check one it sends (what the HTTP/1.1 side gets must be well-formed).
    func header(_ frame: nghttp2_frame, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Int32 {
        let id = frame.hd.stream_id
        guard let stream = streams[id], stream.malformation == nil else { return 0 }
        stream.decodedSize += name.count + value.count + 4
        if stream.decodedSize > configuration.headerLimits.headerSection {
            return malformed(id, "the response header section is larger than \(configuration.headerLimits.headerSection) bytes")
        }
        let nameText = String(decoding: name, as: UTF8.self)
        if nameText == ":status" {
            guard let status = Int(String(decoding: value, as: UTF8.self)), (100...999).contains(status) else {
                return malformed(id, "invalid :status")
            }
            stream.status = status
            return 0
        }
        guard let valueText = HTTP2RequestBuilder.validValue(value) else {
            return malformed(id, "invalid value for \(nameText)")
        }
        // The value was checked just above; the name as `problem(with:)` checks names.
        guard FieldBytes.isLowercaseToken(name) else {
            return malformed(id, "field name \"\(nameText)\" is not a lowercase token")
        }
        if HTTP2ResponseTranslation.isConnectionSpecific(nameText) { return malformed(id, "connection-specific field \(nameText)") }
        stream.fields.append(HTTPField(name: nameText, value: valueText))
        return 0
    }

    func invalidHeader(_ frame: nghttp2_frame, name: UnsafeRawBufferPointer) -> Int32 {
        malformed(frame.hd.stream_id, "nghttp2 refused the field \(String(decoding: name, as: UTF8.self))")
    }

    /// Resets the stream; the engine hears it once (`malformedResponse`), then `streamClosed`.
    private func malformed(_ id: HTTP2StreamID, _ why: String) -> Int32 {
        guard let stream = streams[id], stream.malformation == nil else { return 0 }
        stream.malformation = why
        events.append(.malformedResponse(id, why))
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, HTTP2ErrorCode.protocolError.rawValue)
        return 0
    }

    func frameReceived(_ frame: nghttp2_frame) -> Int32 {
        let id = frame.hd.stream_id
        let endStream = frame.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        switch frame.hd.type {
        case UInt8(NGHTTP2_HEADERS.rawValue):
            guard let stream = streams[id], stream.malformation == nil else { return 0 }
            if stream.finalResponseSeen {
                // Trailers (RFC 9113 §8.1): a HEADERS section after the DATA, ending the stream.
                stream.responseEnded = true
                events.append(.responseEnd(id, trailers: stream.fields))
                return 0
            }
            guard let status = stream.status else { return malformed(id, "a response without :status") }
            if status < 200 {
                guard status != 101, !endStream else { return malformed(id, "invalid interim response \(status)") }
                events.append(.informational(id, status: status, fields: stream.fields))
                return 0
            }
            stream.finalResponseSeen = true
            if endStream { stream.responseEnded = true }
            events.append(.response(id, status: status, fields: stream.fields, endStream: endStream))
        case UInt8(NGHTTP2_DATA.rawValue):
            guard endStream, let stream = streams[id], stream.malformation == nil, stream.finalResponseSeen,
                  !stream.responseEnded else { return 0 }
            stream.responseEnded = true
            events.append(.responseEnd(id, trailers: []))
        case UInt8(NGHTTP2_WINDOW_UPDATE.rawValue):
            events.append(.sendWindowOpened(id))
        case UInt8(NGHTTP2_SETTINGS.rawValue):
            guard frame.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 else { return 0 }
            events.append(.sendWindowOpened(0))
            let value = nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
            let limit: Int? = value == UInt32.max ? nil : Int(value)
            let first = !remoteSettingsReceived
            remoteSettingsReceived = true
            if limit != peerMaxConcurrentStreams || first {
                peerMaxConcurrentStreams = limit
                events.append(.concurrencyChanged(limit))
            }
        case UInt8(NGHTTP2_GOAWAY.rawValue):
            goawayReceived = true
            events.append(.goaway(lastStreamID: frame.goaway.last_stream_id, HTTP2ErrorCode(rawValue: frame.goaway.error_code)))
        default:
            break
        }
        return 0
    }

    func dataChunk(_ id: HTTP2StreamID, _ data: UnsafeRawBufferPointer) -> Int32 {
        // The shared connection's window goes back at once; each stream's own bounds what it holds (`consumeResponseBody`).
        _ = nghttp2_session_consume_connection(session, data.count)
        guard let stream = streams[id], stream.malformation == nil else { return 0 }  // nobody will consume it
        stream.unconsumed += data.count
        if let buffer = inPlaceBuffer, let start = data.baseAddress, let base = buffer.baseAddress, start >= base,
           case let offset = start - base, offset <= buffer.count - data.count {
            events.append(.responseBodyAt(id, offset..<offset + data.count))
        } else {
            events.append(.responseBody(id, Array(data)))
        }
        return 0
    }

    func streamClosed(_ id: HTTP2StreamID, code: HTTP2ErrorCode) -> Int32 {
        guard let stream = streams.removeValue(forKey: id) else { return 0 }
        let end: HTTP2StreamEnd
        if stream.malformation != nil {
            end = .resetByProxy(.protocolError)
        } else if code == .noError && stream.responseEnded {
            end = .completed
        } else if code == .noError {
            end = .resetByProxy(.cancel)
        } else {
            end = .resetByClient(code)
        }
        events.append(.streamClosed(id, end))
        return 0
    }

    func readRequestBody(_ id: HTTP2StreamID, _ buffer: UnsafeMutableRawBufferPointer,
                         _ flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard streams[id]?.outbound != nil else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        // Out of the table while it changes, so the queue's storage stays uniquely owned (no copy on write).
        var body = streams[id]!.outbound!
        streams[id]!.outbound = nil
        defer { streams[id]!.outbound = body }
        let n = body.read(into: buffer, flags: flags, lowWatermark: configuration.requestBodyLowWatermark,
                          drained: { events.append(.requestBodyDrained(id)) },
                          submitTrailers: { trailers in
                              HTTP2ServerSession.withNameValues(pseudo: [], fields: trailers) { list, count in
                                  nghttp2_submit_trailer(session, id, list, count)
                              }
                          })
        if n > 0 { events.append(.requestBodySent(id)) }
        return n
    }
}
