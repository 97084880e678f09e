@testable import DatamodeEngine
import Testing

/// The engine's state machines without sockets or sleeping: every timeout of SPEC §6 (client-idle,
/// client-header, drain, upstream-response) is a value transition here, driven with explicit times.
@Suite struct HTTP1SessionStateMachineTests {
    typealias Machine = HTTP1SessionStateMachine<Int>
    static let timeouts = Machine.Timeouts(clientIdle: 60_000, clientHeader: 15_000, drain: 10_000)

    /// An exchange that closes the connection with its request body still arriving (an origin answered before
    /// reading it): once the output is written the connection lingers, reading what comes, until the client ends
    /// or `lingerAtMost` passes; it never lingers when the body was read whole or the client already ended.
    @Test func aConnectionClosedWithItsRequestBodyUnreadLingers() {
        var flushed = Machine(timeouts: Self.timeouts)
        flushed.forward(1)
        #expect(flushed.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 0, requestUnread: true)
                == .linger(milliseconds: Machine.Timeouts.lingerAtMost))
        guard case .lingering = flushed.state else { Issue.record("\(flushed.state)"); return }
        #expect(flushed.exchange == nil)
        #expect(flushed.clientEndedWhileLingering() == .close)
        #expect(flushed.isClosed)

        var slow = Machine(timeouts: Self.timeouts)
        slow.forward(2)
        #expect(slow.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 100, requestUnread: true)
                == .armTimer(milliseconds: 10_000))
        #expect(slow.outputDrained() == .linger(milliseconds: Machine.Timeouts.lingerAtMost))
        #expect(slow.timerFired(outputBacklog: 0) == .close, "lingering ends when its time is up")

        // Under TLS the records are written after the plaintext: the timer sees the output empty.
        var tls = Machine(timeouts: Self.timeouts)
        tls.forward(3)
        _ = tls.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 100, requestUnread: true)
        #expect(tls.timerFired(outputBacklog: 0) == .linger(milliseconds: Machine.Timeouts.lingerAtMost))

        var whole = Machine(timeouts: Self.timeouts)
        whole.forward(4)
        #expect(whole.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 0, requestUnread: false) == .close)

        var ended = Machine(timeouts: Self.timeouts)
        ended.forward(5)
        ended.clientSentEOF()
        #expect(ended.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 0, requestUnread: true) == .close)
        #expect(ended.clientEndedWhileLingering() == .none)
    }

    @Test func anIdleConnectionWaitsClientIdleThenCloses() {
        var machine = Machine(timeouts: Self.timeouts)
        #expect(machine.started() == .armTimer(milliseconds: 60_000))
        #expect(machine.timerFired(outputBacklog: 0) == .close)
        #expect(machine.isClosed)
    }

    @Test func aHeadsFirstByteStartsClientHeaderOnce() {
        var machine = Machine(timeouts: Self.timeouts)
        #expect(machine.headBytesBuffered(now: 1_000) == .armTimer(milliseconds: 15_000))
        // More bytes of the same head do not restart it (slowloris: trickling does not buy time).
        #expect(machine.headBytesBuffered(now: 9_000) == .none)
        let (since, action) = machine.headParsed()
        #expect(since == 1_000)
        #expect(action == .disarmTimer)
    }

    @Test func aHeadThatTricklesInIsCutWhenClientHeaderFires() {
        var machine = Machine(timeouts: Self.timeouts)
        _ = machine.headBytesBuffered(now: 5)
        #expect(machine.timerFired(outputBacklog: 0) == .close)
    }

    @Test func keepAliveReadsTheNextHeadOtherwiseCloseAfterFlushing() {
        var kept = Machine(timeouts: Self.timeouts)
        kept.forward(1)
        #expect(kept.exchange == 1)
        #expect(kept.timerFired(outputBacklog: 0) == .none, "no client timer while an exchange runs")
        #expect(kept.exchangeFinished(keepAlive: true, draining: false, outputBacklog: 100) == .none)
        #expect(kept.isReadingHead)
        #expect(kept.inputEmpty(outputBacklog: 0) == .armTimer(milliseconds: 20), "the park timer first")

        var closing = Machine(timeouts: Self.timeouts)
        closing.forward(2)
        #expect(closing.exchangeFinished(keepAlive: false, draining: false, outputBacklog: 100) == .armTimer(milliseconds: 10_000))
        #expect(closing.outputDrained() == .close)

        var empty = Machine(timeouts: Self.timeouts)
        empty.forward(3)
        #expect(empty.exchangeFinished(keepAlive: true, draining: true, outputBacklog: 0) == .close)
    }

    /// An idle keep-alive connection gives its buffers back after 20 ms (issue 12) and still closes when
    /// `client-idle` ends, counted from when it went idle, not from when it was parked.
    @Test func anIdleConnectionIsParkedThenClosedAtClientIdle() {
        var machine = Machine(timeouts: Self.timeouts)
        machine.forward(1)
        _ = machine.exchangeFinished(keepAlive: true, draining: false, outputBacklog: 0)
        #expect(machine.inputEmpty(outputBacklog: 0) == .armTimer(milliseconds: 20))
        #expect(machine.timerFired(outputBacklog: 0) == .park(thenArmMilliseconds: 59_980))
        #expect(machine.isReadingHead, "parked only once the executor has freed the buffers")
        machine.parked()
        #expect(machine.isParked && machine.exchange == nil)
        #expect(machine.timerFired(outputBacklog: 0) == .close)
        #expect(machine.isClosed)
    }

    /// A parked connection wakes as a new session (`ParkedConnection.wake`), whose machine waits for a head with the
    /// rest of `client-idle` armed (`resume`): that timer closes, it does not park again.
    @Test func aParkedConnectionWakesForItsNextHeadWithTheIdleClockRunning() {
        var machine = Machine(timeouts: Self.timeouts)
        #expect(machine.isReadingHead && !machine.parkDue)
        #expect(machine.timerFired(outputBacklog: 0) == .close)

        var woken = Machine(timeouts: Self.timeouts)
        #expect(woken.headBytesBuffered(now: 7) == .armTimer(milliseconds: 15_000))
    }

    @Test func aShortClientIdleParksAtHalfOfIt() {
        var machine = Machine(timeouts: .init(clientIdle: 30, clientHeader: 15_000, drain: 10_000))
        #expect(machine.inputEmpty(outputBacklog: 0) == .armTimer(milliseconds: 15))
        #expect(machine.timerFired(outputBacklog: 0) == .park(thenArmMilliseconds: 15))
        var tiny = Machine(timeouts: .init(clientIdle: 1, clientHeader: 15_000, drain: 10_000))
        #expect(tiny.inputEmpty(outputBacklog: 0) == .armTimer(milliseconds: 1), "too short to park")
        #expect(tiny.timerFired(outputBacklog: 0) == .close)
    }

    /// SPEC §6 "No byte is lost": a slow reader is cut only after a whole drain-timeout without progress.
    @Test func theClosingTimerCutsOnlyAReaderThatStoppedReading() {
        var machine = Machine(timeouts: Self.timeouts)
        #expect(machine.closeWhenFlushed(outputBacklog: 500_000) == .armTimer(milliseconds: 10_000))
        #expect(machine.timerFired(outputBacklog: 300_000) == .armTimer(milliseconds: 10_000))
        #expect(machine.timerFired(outputBacklog: 100) == .armTimer(milliseconds: 10_000))
        #expect(machine.timerFired(outputBacklog: 100) == .close)
    }

    @Test func aHalfClosedClientIsAnsweredThenClosed() {
        var machine = Machine(timeouts: Self.timeouts)
        machine.forward(1)
        machine.clientSentEOF()
        // Requests it pipelined before its EOF are still read and answered; then it is closed.
        #expect(machine.exchangeFinished(keepAlive: true, draining: false, outputBacklog: 10) == .none)
        #expect(machine.isReadingHead)
        #expect(machine.inputEmpty(outputBacklog: 10) == .armTimer(milliseconds: 10_000))

        var reading = Machine(timeouts: Self.timeouts)
        _ = reading.headBytesBuffered(now: 1)
        reading.clientSentEOF()
        #expect(reading.incompleteHeadAtEOF(outputBacklog: 0) == .close)
    }

    @Test func nothingHappensAfterClosed() {
        var machine = Machine(timeouts: Self.timeouts)
        machine.closed()
        machine.forward(1)
        #expect(machine.exchange == nil)
        #expect(machine.timerFired(outputBacklog: 5) == .none)
        #expect(machine.exchangeFinished(keepAlive: true, draining: false, outputBacklog: 0) == .none)
    }
}

@Suite struct OriginResponseTimerTests {
    /// The upload case found from outside: bytes keep moving, so the watchdog re-arms, and the head timeout
    /// starts only once the last request byte has left the output.
    @Test func anUploadThatKeepsMovingIsNeverCut() {
        var timer = OriginResponseTimer(timeoutMs: 3_000)
        #expect(timer.requestStarted(connected: true, pending: 300) == .arm(milliseconds: 3_000))
        for _ in 0..<10 {
            timer.queued(512 * 1024)
            #expect(timer.fired(pending: 400_000) == .arm(milliseconds: 3_000))
        }
        #expect(timer.requestComplete(pending: 200_000) == .none)
        #expect(timer.written(pending: 10) == .none)
        #expect(timer.written(pending: 0) == .arm(milliseconds: 3_000))
        #expect(timer.phase == .awaitingHead)
        #expect(timer.fired(pending: 0) == .timeOut(detail: "sent no response head within timeouts.upstream-response"))
    }

    @Test func anOriginThatStopsReadingTimesOutAfterOneStillPeriod() {
        var timer = OriginResponseTimer(timeoutMs: 1_000)
        _ = timer.requestStarted(connected: true, pending: 100)
        timer.queued(524_288)
        #expect(timer.fired(pending: 524_388) == .arm(milliseconds: 1_000))
        #expect(timer.fired(pending: 524_388)
            == .timeOut(detail: "made no progress sending the request within timeouts.upstream-response"))
    }

    @Test func theClockWaitsForTheConnectionAndStopsAtTheHead() {
        var timer = OriginResponseTimer(timeoutMs: 1_000)
        #expect(timer.requestStarted(connected: false, pending: 100) == .none)
        #expect(timer.requestComplete(pending: 100) == .none)
        #expect(timer.connected(pending: 100) == .arm(milliseconds: 1_000))
        #expect(timer.written(pending: 0) == .arm(milliseconds: 1_000))
        timer.headReceived()
        #expect(timer.fired(pending: 0) == .none)
    }

    @Test func aTunnelHasNoResponseTimer() {
        var timer = OriginResponseTimer(timeoutMs: -1)
        #expect(timer.requestStarted(connected: true, pending: 0) == .none)
        #expect(timer.fired(pending: 0) == .none)
    }
}

@Suite struct ExchangeStateMachineTests {
    func step(_ result: RelayStep.Result, before: Int, left: Int) -> RelayStep {
        RelayStep(result: result, before: before, left: left)
    }

    @Test func anOriginsEOFEndsTheBodyOnlyOnceItsBytesAreRelayed() {
        var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = machine.upstreamConnected()
        #expect(machine.responseHead(untilClose: false, originKeepsConnection: false, clientKeepsConnection: true) == .pumpResponseBody)
        #expect(machine.originSentEOF() == .pumpResponseBody)
        // The client's buffer is full: 800 KB still wait in the upstream's input.
        #expect(machine.responseBodyStep(step(.moving, before: 800_000, left: 300_000), unwritten: false) == .none)
        #expect(machine.responseBodyStep(step(.complete, before: 300_000, left: 0), unwritten: false)
            == .finish(recycleUpstream: false))
        #expect(machine.keepAlive)
    }

    @Test func aCloseDelimitedBodyEndsWhenDrainedAfterTheEOF() {
        var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = machine.responseHead(untilClose: true, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(!machine.keepAlive)
        _ = machine.originSentEOF()
        #expect(machine.responseBodyStep(step(.moving, before: 10, left: 4), unwritten: false) == .none)
        #expect(machine.responseBodyStep(step(.moving, before: 4, left: 0), unwritten: false) == .finish(recycleUpstream: false))
    }

    /// An origin whose connection failed (reset, TLS cut without close_notify) after it began a close-delimited
    /// body: its bytes are drained as after an EOF, and the response then ends truncated, never complete.
    @Test func aCloseDelimitedBodyCutByTheOriginIsRelayedThenTruncated() {
        var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = machine.responseHead(untilClose: true, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(machine.originBrokeOffAfterSending() == .pumpResponseBody)
        #expect(machine.responseBodyStep(step(.moving, before: 10, left: 4), unwritten: false) == .none)
        #expect(machine.responseBodyStep(step(.moving, before: 4, left: 0), unwritten: false) == .truncate(.upstreamAborted))

        // Before any head: the break is remembered, and the body read later ends the same way.
        var held = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = held.upstreamConnected()
        #expect(held.originBrokeOffAfterSending() == .none)
        #expect(held.responseHead(untilClose: true, originKeepsConnection: true, clientKeepsConnection: true) == .pumpResponseBody)
        #expect(held.responseBodyStep(step(.moving, before: 7, left: 0), unwritten: false) == .truncate(.upstreamAborted))
    }

    @Test func aShortBodyIsTruncatedAndAStalledChunkLineToo() {
        var short = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = short.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        _ = short.originSentEOF()
        #expect(short.responseBodyStep(step(.moving, before: 5, left: 0), unwritten: false) == .truncate(.upstreamAborted))
        #expect(!short.keepAlive)

        var stalled = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = stalled.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        _ = stalled.originSentEOF()
        #expect(stalled.responseBodyStep(step(.moving, before: 3, left: 3), unwritten: false) == .truncate(.upstreamAborted))
    }

    @Test func badResponseFramingIs502WhileNothingWasWritten() {
        var early = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = early.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(early.responseBodyStep(step(.invalid, before: 9, left: 9), unwritten: true) == .retractAndAnswerBadGateway)
        #expect(early.keepAlive)

        var late = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = late.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(late.responseBodyStep(step(.invalid, before: 9, left: 9), unwritten: false) == .truncate(.upstreamProtocolError))
    }

    @Test func anUpstreamIsRecycledOnlyAtAMessageBoundary() {
        var clean = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = clean.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(clean.responseBodyStep(step(.complete, before: 5, left: 0), unwritten: false) == .finish(recycleUpstream: true))

        var extra = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = extra.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(extra.responseBodyStep(step(.complete, before: 9, left: 4), unwritten: false) == .finish(recycleUpstream: false),
                "bytes after the body: the origin is confused")

        var saysClose = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = saysClose.responseHead(untilClose: false, originKeepsConnection: false, clientKeepsConnection: true)
        #expect(saysClose.responseBodyStep(step(.complete, before: 5, left: 0), unwritten: false) == .finish(recycleUpstream: false))

        var earlyAnswer = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        _ = earlyAnswer.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(!earlyAnswer.keepAlive, "the request body is unread: the client connection cannot be reused")
        #expect(earlyAnswer.responseBodyStep(step(.complete, before: 5, left: 0), unwritten: false) == .finish(recycleUpstream: false))
    }

    @Test func aClientThatHalfClosesIsAbortedOnlyWhenItsBodyEndsShort() {
        var machine = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        #expect(machine.clientSentEOF() == .pumpRequestBody)
        #expect(machine.requestBodyStep(step(.moving, before: 900_000, left: 400_000)) == .none, "still relaying")
        #expect(machine.requestBodyStep(step(.complete, before: 400_000, left: 0)) == .requestSent)

        var short = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        _ = short.clientSentEOF()
        #expect(short.requestBodyStep(step(.moving, before: 10, left: 0)) == .abort(.clientAborted))
    }

    @Test func aStalePooledConnectionIsRetriedOnceAndOnlyWhenTheRequestCanBeSentAgain() {
        var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = machine.upstreamConnected()
        #expect(machine.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 0, timedOut: false) == .retryOnNewConnection)
        #expect(machine.phase == .connecting)
        _ = machine.upstreamConnected()
        #expect(machine.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 0, timedOut: false) == .answer(close: false),
                "only once")

        var fresh = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        #expect(fresh.upstreamFailed(reusedConnection: false, bodyBytesConsumed: 0, timedOut: false) == .answer(close: false))
        var consumed = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        #expect(consumed.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 10, timedOut: false) == .answer(close: true))
        #expect(!consumed.keepAlive)
        var slow = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        #expect(slow.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 0, timedOut: true) == .answer(close: false),
                "an origin that is merely slow must not get the request twice")
        var started = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = started.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(started.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 0, timedOut: false) == .abort)
        var hinted = ExchangeStateMachine(requestComplete: true, keepAlive: true)
        _ = hinted.upstreamConnected()
        hinted.originSentInterim()
        #expect(hinted.upstreamFailed(reusedConnection: true, bodyBytesConsumed: 0, timedOut: false) == .answer(close: false),
                "an origin that sent a 103 acted on the request: not sent again, and no second 103 behind the first")
    }

    @Test func badRequestFramingIsRefusedBeforeTheResponseAndAbortedAfter() {
        var before = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        #expect(before.requestBodyStep(step(.invalid, before: 4, left: 4)) == .refuseRequest)
        var after = ExchangeStateMachine(requestComplete: false, keepAlive: true)
        _ = after.responseHead(untilClose: false, originKeepsConnection: true, clientKeepsConnection: true)
        #expect(after.requestBodyStep(step(.invalid, before: 4, left: 4)) == .abort(.badRequest))
    }
}

@Suite struct TunnelStateMachineTests {
    @Test func eachEOFIsPassedOnOnlyOnceItsBytesAreWritten() {
        var tunnel = TunnelStateMachine(established: true)
        tunnel.originSentEOF()
        #expect(tunnel.nextAction(TunnelBuffers(clientInput: 0, originOutput: 0, originInput: 700, clientOutput: 0)) == nil)
        #expect(tunnel.nextAction(.empty) == .shutDownClientWrite)
        tunnel.clientSentEOF()
        #expect(tunnel.nextAction(TunnelBuffers(clientInput: 0, originOutput: 5, originInput: 0, clientOutput: 0)) == nil)
        #expect(tunnel.nextAction(.empty) == .shutDownOriginWrite)
        #expect(tunnel.nextAction(.empty) == .close)
        #expect(tunnel.nextAction(.empty) == nil)
    }

    @Test func aTunnelIsSplicedOnlyWhileBothDirectionsFlow() {
        var tunnel = TunnelStateMachine()
        #expect(!tunnel.canSplice)
        tunnel.established()
        let spliced = tunnel.spliced()
        #expect(spliced)
        #expect(tunnel.spliceFinished() == .close)

        var ended = TunnelStateMachine(established: true)
        ended.clientSentEOF()
        let endedSpliced = ended.spliced()
        #expect(!endedSpliced)
    }
}
