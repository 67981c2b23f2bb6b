package h1

import (
	"bytes"
	"fmt"
	"strconv"
)

// Bounds on what one direction may make this package hold.
const (
	maxHead      = 1 << 20 // bytes of a head, or of a trailer section
	maxChunkLine = 4 << 10 // bytes of a chunk size line, CRLF included (as net/http)
	keepBuf      = 64 << 10
)

// state is where a reader is in a message.
type state uint8

const (
	inHead      state = iota // before or in a head
	inLength                 // in a body of known length
	inChunkLine              // in a chunk size line
	inChunkData              // in a chunk's data
	inChunkEnd               // in the CRLF after a chunk's data
	inTrailer                // in the trailer section after the last chunk
	inUntilEOF               // in a body that ends when the connection does
)

// inBody reports whether a reader in state st is in a body's bytes: what
// it consumes there, all of it, is body.
func (st state) inBody() bool {
	return st == inLength || st == inChunkData || st == inUntilEOF
}

// event is what a reader reports when it stops before the end of its input.
type event uint8

const (
	evNone event = iota // the input was consumed
	evHead              // a head passed whole: see reader.head
	evEnd               // a body ended, and with it the message
)

// reader follows the messages of one direction: it finds where heads end,
// keeping their bytes, and counts body bytes without keeping them.
type reader struct {
	st     state
	buf    []byte // an unfinished head or chunk size line
	head   []byte // the last head that passed, valid until the next feed
	n      int    // bytes of the current head, trailer or chunk size line so far
	lines  int    // lines of the current head or trailer that ended
	cur    int    // bytes of the current line so far
	cr     bool   // the current line so far is a lone CR
	remain uint64 // bytes left in the body or chunk
	body   int64  // body bytes passed in the current message
}

// feed consumes p up to the next event. skipBlank says whether blank
// lines before a head are skipped (requests) or malformed (responses).
func (r *reader) feed(p []byte, skipBlank bool) (int, event, error) {
	switch r.st {
	case inHead:
		return r.feedHead(p, skipBlank)
	case inLength:
		n := r.data(p)
		if r.remain == 0 {
			r.st = inHead
			return n, evEnd, nil
		}
		return n, evNone, nil
	case inChunkData:
		n := r.data(p)
		if r.remain == 0 {
			r.st, r.n = inChunkEnd, 0
		}
		return n, evNone, nil
	case inChunkEnd:
		return r.feedChunkEnd(p)
	case inChunkLine:
		return r.feedChunkLine(p)
	case inTrailer:
		end := r.scan(p)
		if end < 0 {
			r.n += len(p)
			if r.n > maxHead {
				return 0, evNone, fmt.Errorf("%w: trailer section above %d bytes", ErrTooLarge, maxHead)
			}
			return len(p), evNone, nil
		}
		r.st, r.n, r.lines = inHead, 0, 0
		return end, evEnd, nil
	case inUntilEOF:
		r.body += int64(len(p))
		return len(p), evNone, nil
	}
	return 0, evNone, fmt.Errorf("%w: unknown reader state %d", ErrMalformed, r.st)
}

// data counts the body bytes of p that belong to the current body or chunk.
func (r *reader) data(p []byte) int {
	n := len(p)
	if uint64(n) > r.remain {
		n = int(r.remain)
	}
	r.remain -= uint64(n)
	r.body += int64(n)
	return n
}

// feedHead looks for the end of a head, buffering its bytes when it does
// not pass in one piece.
func (r *reader) feedHead(p []byte, skipBlank bool) (int, event, error) {
	start := 0
	for {
		end := r.scan(p[start:])
		if end < 0 {
			if r.n+len(p)-start > maxHead {
				return 0, evNone, fmt.Errorf("%w: head above %d bytes", ErrTooLarge, maxHead)
			}
			r.buf = append(r.buf, p[start:]...)
			r.n += len(p) - start
			return len(p), evNone, nil
		}
		if r.n+end > maxHead {
			return 0, evNone, fmt.Errorf("%w: head above %d bytes", ErrTooLarge, maxHead)
		}
		if r.lines == 0 { // the blank line came first
			if !skipBlank {
				return 0, evNone, fmt.Errorf("%w: blank line where a status line was due", ErrMalformed)
			}
			start += end
			r.buf, r.n = r.buf[:0], 0
			continue
		}
		if len(r.buf) == 0 {
			r.head = p[start : start+end]
		} else {
			r.buf = append(r.buf, p[start:start+end]...)
			r.head = r.buf
		}
		r.n, r.lines = 0, 0
		return start + end, evHead, nil
	}
}

// release drops the head buffer once its head is parsed, freeing it if a
// large head grew it.
func (r *reader) release() {
	r.head = nil
	if cap(r.buf) > keepBuf {
		r.buf = nil
	}
	r.buf = r.buf[:0]
}

// scan looks in p for the blank line ("\r\n" or "\n") that ends a head or
// trailer section, carrying the state of an unfinished line from one call
// to the next. It returns the index just past the blank line, or -1 when
// p ends first. Complete lines before it are counted in r.lines.
func (r *reader) scan(p []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			r.extend(p[i:])
			return -1
		}
		r.extend(p[i : i+j])
		blank := r.cur == 0 || r.cr
		r.cur, r.cr = 0, false
		i += j + 1
		if blank {
			return i
		}
		r.lines++
	}
}

// extend adds a piece of the current line, without its line feed.
func (r *reader) extend(seg []byte) {
	if len(seg) == 0 {
		return
	}
	r.cr = r.cur == 0 && len(seg) == 1 && seg[0] == '\r'
	r.cur += len(seg)
}

// feedChunkLine collects a chunk size line and starts its chunk.
func (r *reader) feedChunkLine(p []byte) (int, event, error) {
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		if r.n+len(p) >= maxChunkLine {
			return 0, evNone, fmt.Errorf("%w: chunk size line above %d bytes", ErrTooLarge, maxChunkLine)
		}
		r.buf = append(r.buf, p...)
		r.n += len(p)
		return len(p), evNone, nil
	}
	if r.n+i+1 > maxChunkLine {
		return 0, evNone, fmt.Errorf("%w: chunk size line above %d bytes", ErrTooLarge, maxChunkLine)
	}
	line := p[:i]
	if len(r.buf) > 0 {
		r.buf = append(r.buf, line...)
		line = r.buf
	}
	size, err := chunkSize(line)
	r.buf, r.n = r.buf[:0], 0
	if err != nil {
		return 0, evNone, err
	}
	if size == 0 {
		r.st = inTrailer
	} else {
		r.st, r.remain = inChunkData, size
	}
	return i + 1, evNone, nil
}

// chunkSize parses a chunk size line without its line feed. As in
// net/http, it must end in CR and hold no other CR; extensions (from the
// first semicolon) are ignored, and so are blanks before them (RFC 9112's
// BWS, which net/http does not allow).
func chunkSize(line []byte) (uint64, error) {
	line, ok := bytes.CutSuffix(line, []byte("\r"))
	if !ok || bytes.IndexByte(line, '\r') >= 0 {
		return 0, fmt.Errorf("%w: chunk size line does not end in CRLF", ErrMalformed)
	}
	line, _, _ = bytes.Cut(line, []byte(";"))
	line = bytes.TrimRight(line, " \t")
	size, err := strconv.ParseUint(string(line), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: bad chunk size %q", ErrMalformed, line)
	}
	return size, nil
}

// feedChunkEnd checks the CRLF after a chunk's data; r.n counts what of it
// passed.
func (r *reader) feedChunkEnd(p []byte) (int, event, error) {
	const crlf = "\r\n"
	n := 0
	for ; n < len(p) && r.n < len(crlf); n++ {
		if p[n] != crlf[r.n] {
			return 0, evNone, fmt.Errorf("%w: chunk data not followed by CRLF", ErrMalformed)
		}
		r.n++
	}
	if r.n == len(crlf) {
		r.st, r.n = inChunkLine, 0
	}
	return n, evNone, nil
}

// bodyKind is how a message's body is delimited.
type bodyKind uint8

const (
	noBody bodyKind = iota
	lengthBody
	chunkedBody
	untilEOFBody
)

// expect sets up the body that follows the head just passed. It reports
// whether the message ended with its head.
func (r *reader) expect(kind bodyKind, length uint64) bool {
	r.body = 0
	switch {
	case kind == chunkedBody:
		r.st, r.n = inChunkLine, 0
	case kind == untilEOFBody:
		r.st = inUntilEOF
	case kind == lengthBody && length > 0:
		r.st, r.remain = inLength, length
	default:
		return true
	}
	return false
}
