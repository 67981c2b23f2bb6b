package wire

import "sync"

// Serve hands each stream the peer opens to handle, one at a time, in the
// order the peer opened them, and runs done, in a goroutine of its own,
// once the session ended and handle returned for the last time. handle
// runs in a goroutine of the session's that lives only while streams
// arrive: the framer sees each stream's first frame, and starts one when
// none is running. So an idle session keeps no goroutine waiting to
// accept a stream, where a loop around AcceptStream keeps one for its
// whole life (its stack: 2 KiB or more of an idle session's 24 KB at the
// edge). handle should hand a stream that takes long to a goroutine of
// its own: the next stream waits for it.
//
// Serve is called once, and AcceptStream not at all then. Streams the
// peer opened before it are handed to handle too.
//
// Once Serve runs, the session reads no more of the peer's frames while
// its accept queue is full (backlog streams wait for handle): a burst of
// streams waits for handle to catch up, where muxado would reset those
// past the queue after a millisecond. So the queue can be short (muxado
// keeps room for backlog streams, 16 bytes each, for the session's whole
// life), and a handle that blocks stops the session's reading.
func (s *Session) Serve(handle func(*Stream), done func()) {
	v := &s.serving
	v.mu.Lock()
	defer v.mu.Unlock()
	v.handle, v.done = handle, done
	if v.over {
		s.finishLocked()
		return
	}
	s.acceptLocked()
}

// serving is the state of Serve.
type serving struct {
	mu       sync.Mutex
	handle   func(*Stream) // nil until Serve
	done     func()
	opened   int           // streams the peer opened that were not handed to handle yet (or turned away: see unopened)
	backlog  int           // the room of muxado's accept queue
	room     chan struct{} // closed when opened falls below backlog; nil while the reader does not wait
	running  bool          // a goroutine accepts them
	over     bool          // the session ended
	finished bool          // done was started
}

// opened counts a stream the peer opens (the framer read its first frame;
// muxado queues it for AcceptStream next), and starts a goroutine to
// accept it when none runs. Once Serve runs, it waits, in the session's
// reader, while muxado's accept queue is full.
func (s *Session) opened() {
	v := &s.serving
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.handle != nil && !v.over && v.opened >= v.backlog {
		if v.room == nil {
			v.room = make(chan struct{})
		}
		room := v.room
		v.mu.Unlock()
		<-room
		v.mu.Lock()
	}
	v.opened++
	s.acceptLocked()
}

// unopened uncounts a stream that opened counted and muxado turned away
// without queueing it (the session was going away, or its accept queue
// was full before Serve): no AcceptStream will return it.
func (s *Session) unopened() {
	v := &s.serving
	v.mu.Lock()
	defer v.mu.Unlock()
	v.opened--
	s.roomLocked()
}

// roomLocked wakes the reader waiting for room in the accept queue, if
// there is room. The caller holds serving.mu.
func (s *Session) roomLocked() {
	v := &s.serving
	if v.room != nil && (v.opened < v.backlog || v.over) {
		close(v.room)
		v.room = nil
	}
}

// acceptLocked starts the goroutine that accepts the streams opened, if
// Serve was called and none runs. The caller holds serving.mu.
func (s *Session) acceptLocked() {
	v := &s.serving
	if v.handle == nil || v.running || v.over || v.opened == 0 {
		return
	}
	v.running = true
	go s.accept()
}

// accept hands the streams opened to handle until none is left, or the
// session ended.
func (s *Session) accept() {
	v := &s.serving
	for {
		st, err := s.AcceptStream()
		if err == nil {
			v.handle(st)
		}
		v.mu.Lock()
		if err == nil {
			v.opened--
			s.roomLocked()
		}
		if err != nil || v.opened <= 0 {
			v.running = false
			if v.over {
				s.finishLocked()
			}
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
	}
}

// serveEnded notes that the session ended: done runs once handle is not
// running.
func (s *Session) serveEnded() {
	v := &s.serving
	v.mu.Lock()
	defer v.mu.Unlock()
	v.over = true
	s.roomLocked()
	if !v.running {
		s.finishLocked()
	}
}

// finishLocked starts done, once, if Serve was called. The caller holds
// serving.mu.
func (s *Session) finishLocked() {
	v := &s.serving
	if v.handle == nil || v.finished {
		return
	}
	v.finished = true
	if v.done != nil {
		go v.done()
	}
}
