// Package wire is the protocol between an agent and an edge: the stream
// types, the control messages and the header of a proxied connection. Its
// byte layout is documented in docs/PROTOCOL.md.
//
// # What it takes from muxado
//
// A Session is a session of golang.ngrok.com/muxado/v2, v2.0.2 (go.mod),
// with this package's framer plugged in through muxado's Config.NewFramer
// hook; NewFramer and MuxConfig give the same framer to a stock session.
// The framer reads every frame before muxado does and writes every frame
// muxado writes; a Session's streams take the payloads of their DATA
// frames and write their own DATA frames (recv.go, send.go), and a Session
// writes frames of its own between muxado's (resets). So the package relies
// on how muxado behaves, not only on its API. The API (Client, Server,
// Config's MaxWindowSize, AcceptBacklog and NewFramer, Session, Stream,
// the ErrorCode values and GetError; package frame's Framer, its four
// frame types, their Pack methods and getters) is checked by the compiler.
// Each behaviour below is checked by the test named with it, in
// muxado_contract_test.go, which runs muxado's own sessions (the stock
// framer, watched) against a peer that writes and reads frames one by one
// over loopback TCP (net.Pipe where the transport must stall): a muxado
// upgrade that changes one fails its test.
//
// Setting up, reading and writing:
//
//  1. The hook. Client and Server call Config.NewFramer once, before they
//     return, with the transport they were given, as it is, as both the
//     reader and the writer. NewSession keeps the framer the hook makes
//     (s.fr) and reads its conn itself; NewFramer looks at its writer for a
//     socket (writev) or a TLS conn over BatchWrites.
//     TestMuxadoCallsNewFramerOnce.
//  2. One reader. Only muxado's reader goroutine calls ReadFrame, one call
//     at a time, and it is done with a frame (a DATA frame's payload read,
//     a new stream queued, its answers queued for the writer) before it
//     calls ReadFrame again. Once ReadFrame returned an error it is not
//     called again, and the session dies with that error (Wait's first
//     result; io.EOF becomes a PeerEOF error). The framer's hooks run
//     inside ReadFrame, before muxado sees the frame (Session.opened holds
//     a SYN back while Serve's queue is full), and an error of the framer's
//     own (errWindowPassed) ends the session. TestMuxadoReadsInOneGoroutine;
//     the session's death: TestMuxadoClosesItsTransportWhenItDies.
//  3. One writer. Only muxado's writer goroutine calls WriteFrame, one call
//     at a time, for every frame muxado writes; an error from WriteFrame
//     kills the session (item 19). The framer's lock (turns) serialises
//     muxado's writer with the Session's own writers, not muxado's frames
//     among themselves. TestMuxadoWritesInOneGoroutine.
//  4. Four frame types. muxado hands WriteFrame a *frame.Data (its payload
//     in Bytes(), Length() its length, its FIN and SYN in Flags()), a
//     *frame.WndInc, a *frame.Rst or a *frame.GoAway, nothing else. The
//     framer encodes the first three itself from their getters (the refused
//     hook reads a RST's code) and gives a GOAWAY to the stock framer.
//     TestMuxadoWritesStockFrameTypes.
//  5. The frame layout, big-endian: an 8-byte header (a 24-bit length, a
//     4-bit type: RST 0, DATA 1, WNDINC 2, GOAWAY 3; 4 bits of flags: FIN 1
//     and SYN 2 on DATA; a 32-bit stream ID of 31 bits), then the body: a
//     DATA frame's payload, a RST's u32 error code, a WNDINC's u32
//     increment (1 to 2^31-1), a GOAWAY's u32 last stream ID, u32 error
//     code and debug bytes. framer.go encodes DATA, WNDINC and RST frames
//     itself (putHeader, resetFrames), and docs/PROTOCOL.md says the frames are
//     muxado's byte for byte. TestMuxadoFrameLayout.
//  6. A frame without its payload. The stock framer's ReadFrame reads only
//     a DATA frame's 8-byte header; the payload, Length() bytes, is read
//     from Data.Reader(), from the framer's reader. A DATA frame packed
//     anew with Data.Pack(id, nil, fin, syn) after its payload was read is,
//     to muxado, that frame without a payload: a SYN still opens and
//     queues its stream, a FIN still ends the stream's inbound half, and
//     muxado reads nothing more of the transport for it. The framer's
//     take gives a Session's streams their payloads so (its ready count is
//     what the read buffer holds past the header).
//     TestMuxadoTakesAFrameWithoutItsPayload.
//
// Streams:
//
//  7. The SYN rides on the first DATA frame. OpenStream writes nothing; the
//     first frame of a stream opened here carries SYN (with FIN too when it
//     is CloseWrite's), and the peer accepts a stream only when that frame
//     arrives. A Write of nothing as a stream's first writes no frame, yet
//     counts the SYN sent: the next frame has none. A stream accepted from
//     the peer never sends a SYN. A stream's Id() is the ID its frames carry:
//     odd for those a client opens, even for a server's. Stream.write sends
//     its SYN itself after such an empty muxado Write, made before it looks
//     whether the stream ended, so that a reset's muxado Close (whose FIN
//     carries the SYN if nothing claimed it) and it never both send one;
//     Stream.CloseWrite waits for a first write under way; AcceptStream
//     counts the peer's stream synced. TestMuxadoSYNRidesOnTheFirstDataFrame.
//  8. The accept queue. Streams the peer opens wait for AcceptStream in a
//     queue of AcceptBacklog streams (128 when zero: defaultBacklog), and
//     AcceptStream returns them in the order of their SYNs. A SYN that
//     finds the queue full (and still full after muxado waits a
//     millisecond) is answered with a RST of code AcceptQueueFull, and
//     AcceptStream never returns its stream. Serve keeps the queue's room
//     (serving.backlog) so as never to fill it, and Session.refused counts
//     a stream turned away out. TestMuxadoAcceptQueue.
//  9. Refused while going away. A SYN read once the session started going
//     away (muxado's GoAway, which it calls only as the session dies:
//     item 20) is answered with a RST of code StreamRefused. muxado writes
//     the codes StreamRefused and AcceptQueueFull for a stream it turns
//     away at its SYN, and for nothing else (its other RSTs carry
//     StreamClosed or FlowControlError: items 10, 13 and 15), which is how
//     Session.refused tells a stream that was never queued.
//     TestMuxadoRefusesStreamsWhileGoingAway.
//  10. Frames for a stream muxado does not have. A DATA frame for one is
//     answered with a RST of code StreamClosed, its payload read and
//     dropped, even an empty frame without flags; an empty DATA frame with
//     FIN is ignored, and so is a RST, unanswered. Session.reset relies on
//     it: the empty DATA frame it writes after its RST makes any muxado
//     peer answer with the RST that ends the stream here; a RST is never
//     answered, so resets do not echo; and Close after CloseWrite sends a
//     second empty FIN that no peer answers.
//     TestMuxadoAnswersDataForAnUnknownStream.
//  11. A RST ends a stream at once. A RST for a stream muxado has ends it: a
//     Write waiting for window fails, as do later Writes, and Reads once
//     what was buffered is read, with an error carrying the RST's code;
//     and muxado forgets the stream at once, so that its next frame from
//     the peer meets item 10. Session.reset so ends the stream at a stock
//     peer, failing a write of the peer's stalled on window, and gets the
//     peer's RST back. TestMuxadoRSTEndsAStreamAtOnce.
//  12. The send window. A stream may send MaxWindowSize bytes before the
//     peer grants any (each end takes the peer's window to be its own:
//     the session preamble settles one for both); each WNDINC lets its
//     stream send that many bytes more; a Write larger than what is left is
//     sent as far as the window goes, then waits. send.go counts a stream's
//     window the same way, and NewFramer holds back window updates
//     (windowHold, sessionHold) knowing that the sender goes on into the
//     rest of its window. TestMuxadoSendWindow.
//  13. The receive window. A stream holds MaxWindowSize bytes unread, and a
//     byte more is answered with a RST of code FlowControlError. Each Read
//     that returns bytes grants them back at once: one WNDINC of its count
//     per Read. A Session sends a stock peer up to a whole window unread
//     (and recv.go holds its own streams to the same bound); NewFramer
//     merges and holds muxado's updates. TestMuxadoReceiveWindow.
//  14. CloseWrite sends an empty DATA frame with FIN, through WriteFrame;
//     later Writes fail. Stream.CloseWrite sets shut before it, so that no
//     frame of its own writers follows the FIN.
//     TestMuxadoCloseWriteSendsFIN.
//  15. Close half-closes, then forgets. A stream's Close sends a FIN as
//     CloseWrite does, ends the stream here (Reads and Writes fail) and
//     forgets it, without waiting for the peer: a DATA frame from the peer
//     on it is then answered with a RST of code StreamClosed. Stream.Close
//     promises both when no write is under way.
//     TestMuxadoCloseHalfClosesAndForgets.
//  16. A stream ended both ways is forgotten: once it sent its FIN and read
//     the peer's (even a FIN in a frame whose payload the framer took:
//     item 6), muxado keeps nothing of it. So a Session's streams leave
//     nothing in muxado's map. TestMuxadoForgetsAStreamEndedBothWays.
//  17. A read deadline that passed fails a Read at once with
//     os.ErrDeadlineExceeded, even with bytes buffered. Session.reset sets
//     one (time.Unix(1, 0)) to fail muxado's reads at once;
//     Stream.SetReadDeadline passes deadlines on, for the error muxado's
//     stream gives once it ended. TestMuxadoReadDeadlineInThePast.
//  18. A write deadline bounds the wait for muxado's writer: with one set,
//     a Write whose frame waits for the writer (the framer stuck writing to
//     a stalled connection) fails with a WriteTimeout error once the
//     deadline passed. Stream.write sends a stream's frames through muxado
//     while a deadline is set, and a Pinger's ping is bounded so.
//     TestMuxadoWriteDeadlineBoundsTheWaitForTheWriter.
//
// The session's end:
//
//  19. muxado closes its transport whenever its session dies, and only
//     then. It dies of Close, of a ReadFrame error (the peer closed; the
//     framer's own error), of a frame handleFrame refuses (a SYN of this
//     end's parity, a second SYN for an open stream), of a WriteFrame
//     error, and of a panic in its reader or writer; it does not die of a
//     GOAWAY read, a RST, a frame for a stream it does not have or a
//     stream's flow-control reset. Wait returns once it died. muxConn
//     relies on both halves: the Close of the conn muxado holds is the one
//     sign of the end that every cause gives, and it ends the Session.
//     TestMuxadoClosesItsTransportWhenItDies.
//  20. GOAWAY only as it dies. muxado writes a GOAWAY (a *frame.GoAway,
//     through WriteFrame) only as its session dies; Close's is of code
//     NoError, with the debug text "no error" and the last stream ID the
//     peer opened. So the framer fails every write after a GOAWAY without
//     reading the frame (muxado may still hand it frames whose writers gave
//     up); tunnelkit never calls the unexported session's GoAway method.
//     TestMuxadoWritesGoAwayOnlyAsItDies.
//  21. OpenStream fails once the peer sent a GOAWAY (RemoteGoneAway: the
//     session lives on) or the session died. A Pinger whose ping stream
//     cannot be opened calls Dead; Session.goneAway closes the conn
//     itself, since muxado keeps the session.
//     TestMuxadoOpenStreamFailsAfterGoAwayOrDeath.
//  22. A session's death fails its streams: Writes fail, Reads once what
//     was buffered is read, Close returns at once; AcceptStream fails
//     (once it returned the streams queued before, if any). Session.reset
//     closes the muxado stream of an ended session at once; Serve's accept
//     loop ends. TestMuxadoStreamsFailWhenTheSessionDies.
//  23. Close does not wait for a stalled transport: it gives its GOAWAY a
//     bounded wait (250 ms) for the writer, then closes the transport,
//     which ends the framer's stuck write. Session.Close returns so.
//     TestMuxadoCloseDoesNotWaitForAStalledTransport.
//  24. A session's reader and writer goroutines end once it died: no
//     goroutine of muxado's outlives a Session.
//     TestMuxadoGoroutinesEndWithTheSession.
//  25. The error codes on the wire: NoError 0, ProtocolError 1,
//     InternalError 2, FlowControlError 3, StreamClosed 4, StreamRefused 5,
//     StreamCancelled 6, StreamReset 7, FrameSizeError 8, AcceptQueueFull
//     9; GetError returns the code of muxado's errors. resetFrames writes
//     StreamCancelled, Session.refused reads StreamRefused and
//     AcceptQueueFull, and a peer of another version reads them.
//     TestMuxadoErrorCodes.
//
// Designed around, not relied on (defects of v2.0.2 that a fix would not
// break): muxado ignores a write deadline while a stream's window is shut,
// and its Stream.Close waits behind a Write stalled for window (Session
// resets such a stream instead); it keeps a GOAWAY'd session up
// (Session.goneAway ends it); it waits a millisecond per stream past a
// full accept queue, and keeps those streams in its map (Serve stops
// reading instead); a SYN it refuses while going away leaves its payload
// unread on the transport, to be read as the next frame (a Session's
// framer takes every payload first); its heartbeat wedges after a late
// reply (Heartbeat and Pinger are this package's own). Not used at all:
// NewTypedStreamSession, muxado's Heartbeat, and its session's GoAway
// method.
package wire
