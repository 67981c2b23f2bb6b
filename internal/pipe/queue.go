package pipe

import (
	"net"
	"sync"
)

// Queue is a net.Listener whose conns are handed to it by Push: a server
// (an http.Server) serves the conns some other code accepted and chose
// for it. Use NewQueue.
type Queue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewQueue returns a Queue whose Addr is addr.
func NewQueue(addr net.Addr) *Queue {
	return &Queue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Push hands c to Accept, and reports false once the queue is closed (c
// is then the caller's to close).
func (q *Queue) Push(c net.Conn) bool {
	select {
	case q.conns <- c:
		return true
	case <-q.done:
		return false
	}
}

// Accept returns the next conn pushed, or net.ErrClosed once the queue is
// closed.
func (q *Queue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

// Close closes the queue: Push and Accept fail from then on.
func (q *Queue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

// Done is closed when the queue is.
func (q *Queue) Done() <-chan struct{} { return q.done }

// Addr returns the address NewQueue was given.
func (q *Queue) Addr() net.Addr { return q.addr }
