package h2

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Sizes from RFC 9113.
const (
	frameHeaderLen  = 9       // section 4.1
	defaultMaxFrame = 1 << 14 // SETTINGS_MAX_FRAME_SIZE's initial value and least
	largestMaxFrame = 1<<24 - 1
	defaultTable    = 4096 // SETTINGS_HEADER_TABLE_SIZE's initial value
	settingLen      = 6    // an identifier and a value, section 6.5.1
	rstStreamLen    = 4
	priorityLen     = 5
	pingLen         = 8
	windowUpdateLen = 4
	goAwayMinLen    = 8
)

// maxBuffered bounds the payload of a frame that is kept whole to be read:
// a header block fragment with its padding and priority, or a SETTINGS
// frame.
const maxBuffered = maxHeaderBlock + 1<<10

// frameHeader is the header that starts every frame (RFC 9113, section 4.1).
type frameHeader struct {
	length uint32
	typ    http2.FrameType
	flags  http2.Flags
	id     uint32
}

func parseFrameHeader(b []byte) frameHeader {
	var fh frameHeader
	var typ, flags uint8
	s := cryptobyte.String(b)
	s.ReadUint24(&fh.length)
	s.ReadUint8(&typ)
	s.ReadUint8(&flags)
	s.ReadUint32(&fh.id)
	fh.typ, fh.flags = http2.FrameType(typ), http2.Flags(flags)
	fh.id &^= 1 << 31 // the reserved bit
	return fh
}

// fields holds the pseudo-header fields of a header block.
type fields struct {
	method, path, authority, status string
}

// half reads the frames of one direction, as they arrive in pieces.
type half struct {
	client  bool // the client's direction, which starts with the preface
	preface int  // bytes of the client preface that passed
	started bool // the first frame, SETTINGS, began

	hdr  [frameHeaderLen]byte
	nhdr int
	fh   frameHeader // the frame in progress, once nhdr == frameHeaderLen
	left uint32      // bytes of its payload still to come
	keep uint32      // bytes of its payload to keep in buf
	buf  []byte

	// The header block in progress.
	blockID  uint32 // the stream it is on, or 0 if none
	blockLen int    // bytes of its fragments so far
	blockEnd bool   // its HEADERS frame ended the stream
	push     bool   // it is a PUSH_PROMISE's
	dec      *hpack.Decoder
	f        fields
	collect  bool                // the block's fields are kept for Conn.Header
	hf       []hpack.HeaderField // the fields kept
	hfSize   int                 // bytes of their names and values

	// Set from the other direction's SETTINGS.
	table    atomic.Uint64 // SETTINGS_HEADER_TABLE_SIZE | set; 0 if unset
	maxFrame atomic.Uint32 // the largest SETTINGS_MAX_FRAME_SIZE; 0 if unset
}

const set = 1 << 32 // marks half.table as set

// feed reads p, a piece of the direction's bytes.
func (h *half) feed(c *Conn, p []byte) error {
	for len(p) > 0 {
		if h.client && h.preface < len(http2.ClientPreface) {
			n := min(len(p), len(http2.ClientPreface)-h.preface)
			if string(p[:n]) != http2.ClientPreface[h.preface:h.preface+n] {
				return fmt.Errorf("%w: bad client preface", ErrMalformed)
			}
			h.preface += n
			p = p[n:]
			continue
		}
		if h.nhdr < frameHeaderLen {
			n := copy(h.hdr[h.nhdr:], p)
			h.nhdr += n
			p = p[n:]
			if h.nhdr < frameHeaderLen {
				return nil
			}
			if err := h.begin(); err != nil {
				return err
			}
		} else {
			n := uint32(min(len(p), int(h.left)))
			if k := h.keep - uint32(len(h.buf)); k > 0 {
				h.buf = append(h.buf, p[:min(n, k)]...)
			}
			if h.fh.typ == http2.FrameData && c.Data != nil {
				h.data(c, p[:n])
			}
			h.left -= n
			p = p[n:]
		}
		if h.left > 0 {
			continue
		}
		if err := h.end(c); err != nil {
			return err
		}
		if c.stopped.Load() {
			return nil
		}
		h.nhdr = 0
		if cap(h.buf) > 64<<10 {
			h.buf = nil
		}
		h.buf = h.buf[:0]
	}
	return nil
}

// begin checks the header of a frame and sets up the reading of its payload.
func (h *half) begin() error {
	fh := parseFrameHeader(h.hdr[:])
	h.fh, h.left, h.keep = fh, fh.length, 0
	if limit := max(h.maxFrame.Load(), defaultMaxFrame); fh.length > limit {
		return fmt.Errorf("%w: %v frame of %d bytes, above %d", ErrTooLarge, fh.typ, fh.length, limit)
	}
	if h.blockID != 0 && (fh.typ != http2.FrameContinuation || fh.id != h.blockID) {
		return fmt.Errorf("%w: %v frame where a CONTINUATION of stream %d was due", ErrMalformed, fh.typ, h.blockID)
	}
	if !h.started {
		if fh.typ != http2.FrameSettings || fh.flags.Has(http2.FlagSettingsAck) {
			return fmt.Errorf("%w: first frame is %v, not SETTINGS", ErrMalformed, fh.typ)
		}
		h.started = true
	}
	stream := true // the frame needs a stream
	switch fh.typ {
	case http2.FrameData:
		if fh.flags.Has(http2.FlagDataPadded) {
			h.keep = 1
		}
	case http2.FrameHeaders, http2.FrameContinuation, http2.FramePushPromise:
		if fh.typ == http2.FramePushPromise && h.client {
			return fmt.Errorf("%w: PUSH_PROMISE from the client", ErrMalformed)
		}
		if fh.typ == http2.FrameContinuation && h.blockID == 0 {
			return fmt.Errorf("%w: CONTINUATION without HEADERS", ErrMalformed)
		}
		if fh.length > maxBuffered {
			return fmt.Errorf("%w: header block above %d bytes", ErrTooLarge, maxHeaderBlock)
		}
		h.keep = fh.length
	case http2.FrameSettings:
		stream = false
		if fh.length%settingLen != 0 || fh.flags.Has(http2.FlagSettingsAck) && fh.length != 0 {
			return fmt.Errorf("%w: SETTINGS frame of %d bytes", ErrMalformed, fh.length)
		}
		if fh.length > maxBuffered {
			return fmt.Errorf("%w: SETTINGS frame of %d bytes", ErrTooLarge, fh.length)
		}
		h.keep = fh.length
	case http2.FrameRSTStream:
		if fh.length != rstStreamLen {
			return h.badLength()
		}
		h.keep = fh.length
	case http2.FramePriority:
		if fh.length != priorityLen {
			return h.badLength()
		}
	case http2.FramePing:
		stream = false
		if fh.length != pingLen {
			return h.badLength()
		}
	case http2.FrameGoAway:
		stream = false
		if fh.length < goAwayMinLen {
			return h.badLength()
		}
	case http2.FrameWindowUpdate:
		if fh.length != windowUpdateLen {
			return h.badLength()
		}
		return nil // on any stream, 0 included
	default:
		return nil // unknown frame types are ignored (RFC 9113, section 4.1)
	}
	if stream != (fh.id != 0) {
		return fmt.Errorf("%w: %v frame on stream %d", ErrMalformed, fh.typ, fh.id)
	}
	return nil
}

func (h *half) badLength() error {
	return fmt.Errorf("%w: %v frame of %d bytes", ErrMalformed, h.fh.typ, h.fh.length)
}

// other returns the half of the other direction.
func (h *half) other(c *Conn) *half {
	if h == &c.req {
		return &c.resp
	}
	return &c.req
}

// end acts on a frame that passed whole.
func (h *half) end(c *Conn) error {
	fh := h.fh
	s := cryptobyte.String(h.buf)
	switch fh.typ {
	case http2.FrameData:
		n := int64(fh.length)
		if fh.flags.Has(http2.FlagDataPadded) {
			var pad uint8
			if !s.ReadUint8(&pad) || int64(pad) >= n {
				return fmt.Errorf("%w: DATA frame of %d bytes with %d of padding", ErrMalformed, n, pad)
			}
			n -= 1 + int64(pad)
		}
		if !h.client {
			c.data(fh.id, n, fh.flags.Has(http2.FlagDataEndStream))
		}
	case http2.FrameHeaders:
		var pad uint8
		if fh.flags.Has(http2.FlagHeadersPadded) && !s.ReadUint8(&pad) ||
			fh.flags.Has(http2.FlagHeadersPriority) && !s.Skip(priorityLen) ||
			len(s) < int(pad) {
			return fmt.Errorf("%w: HEADERS frame of %d bytes with %d of padding", ErrMalformed, fh.length, pad)
		}
		if h.client && fh.id%2 == 0 {
			return fmt.Errorf("%w: HEADERS from the client on even stream %d", ErrMalformed, fh.id)
		}
		h.blockID, h.blockLen, h.push = fh.id, 0, false
		h.blockEnd = fh.flags.Has(http2.FlagHeadersEndStream)
		h.f = fields{}
		h.collect = c.Header != nil
		return h.fragment(c, s[:len(s)-int(pad)], fh.flags.Has(http2.FlagHeadersEndHeaders))
	case http2.FramePushPromise:
		var pad uint8
		var promised uint32
		if fh.flags.Has(http2.FlagPushPromisePadded) && !s.ReadUint8(&pad) ||
			!s.ReadUint32(&promised) || len(s) < int(pad) {
			return fmt.Errorf("%w: PUSH_PROMISE frame of %d bytes", ErrMalformed, fh.length)
		}
		h.blockID, h.blockLen, h.push, h.blockEnd = fh.id, 0, true, false
		return h.fragment(c, s[:len(s)-int(pad)], fh.flags.Has(http2.FlagPushPromiseEndHeaders))
	case http2.FrameContinuation:
		return h.fragment(c, s, fh.flags.Has(http2.FlagContinuationEndHeaders))
	case http2.FrameSettings:
		if fh.flags.Has(http2.FlagSettingsAck) {
			return nil
		}
		o := h.other(c)
		for !s.Empty() {
			var id uint16
			var v uint32
			s.ReadUint16(&id)
			s.ReadUint32(&v)
			switch http2.SettingID(id) {
			case http2.SettingHeaderTableSize:
				o.table.Store(uint64(v) | set)
			case http2.SettingMaxFrameSize:
				if v < defaultMaxFrame || v > largestMaxFrame {
					return fmt.Errorf("%w: SETTINGS_MAX_FRAME_SIZE %d", ErrMalformed, v)
				}
				// A frame sent before a lower limit reached its sender is
				// valid: keep the largest.
				if v > o.maxFrame.Load() {
					o.maxFrame.Store(v)
				}
			}
		}
	case http2.FrameRSTStream:
		c.reset(fh.id)
	}
	return nil
}

// fragment decodes a header block fragment; last reports that it ends the
// block.
func (h *half) fragment(c *Conn, frag []byte, last bool) error {
	h.blockLen += len(frag)
	if h.blockLen > maxHeaderBlock {
		return fmt.Errorf("%w: header block above %d bytes", ErrTooLarge, maxHeaderBlock)
	}
	if h.dec == nil {
		h.dec = hpack.NewDecoder(defaultTable, h.emit)
	}
	table := uint32(defaultTable)
	if v := h.table.Load(); v != 0 {
		table = uint32(min(v&^set, maxHeaderBlock))
	}
	h.dec.SetAllowedMaxDynamicTableSize(table)
	if _, err := h.dec.Write(frag); err != nil {
		return h.decodeError(err)
	}
	if !last {
		return nil
	}
	if err := h.dec.Close(); err != nil {
		return h.decodeError(err)
	}
	id := h.blockID
	h.blockID = 0
	defer h.releaseFields()
	switch {
	case h.push:
		return nil
	case h.client:
		open, err := c.open(id, &h.f)
		if open && h.collect {
			h.header(c, id)
		}
		return err
	default:
		var seen func()
		if h.collect {
			seen = func() { h.header(c, id) }
		}
		return c.respond(id, &h.f, h.blockEnd, seen)
	}
}

// header passes the fields of the block that ended on stream id to
// Conn.Header.
func (h *half) header(c *Conn, id uint32) { c.Header(id, !h.client, h.hf, h.blockEnd) }

// releaseFields lets the fields of the block that ended go.
func (h *half) releaseFields() {
	clear(h.hf)
	h.hf, h.hfSize = h.hf[:0], 0
	if cap(h.hf) > 1024 {
		h.hf = nil
	}
}

// data passes to Conn.Data the bytes of piece, the next piece of a DATA
// frame's payload, that are not padding, if the frame's stream is
// tracked. The first byte of a padded frame's payload, its pad length,
// is in h.buf once it passed.
func (h *half) data(c *Conn, piece []byte) {
	fh := h.fh
	off := fh.length - h.left // where piece starts in the payload
	start, end := uint32(0), fh.length
	if fh.flags.Has(http2.FlagDataPadded) {
		if len(h.buf) == 0 {
			return
		}
		pad := uint32(h.buf[0])
		if pad >= fh.length {
			return // malformed: end says so
		}
		start, end = 1, fh.length-pad
	}
	lo, hi := max(off, start), min(off+uint32(len(piece)), end)
	if lo >= hi || !c.tracked(fh.id) {
		return
	}
	c.Data(fh.id, !h.client, piece[lo-off:hi-off])
}

func (h *half) decodeError(err error) error {
	if v := h.table.Load(); v != 0 && v&^set > maxHeaderBlock {
		return fmt.Errorf("%w: header block: %v (table sizes are bounded to %d)", ErrTooLarge, err, maxHeaderBlock)
	}
	return fmt.Errorf("%w: header block: %v", ErrMalformed, err)
}

// emit takes in a decoded header field.
func (h *half) emit(f hpack.HeaderField) {
	if h.push {
		return
	}
	if h.collect && h.hfSize+len(f.Name)+len(f.Value) <= maxHeaderBlock {
		h.hfSize += len(f.Name) + len(f.Value)
		h.hf = append(h.hf, f)
	}
	if len(f.Name) == 0 || f.Name[0] != ':' {
		return
	}
	switch f.Name {
	case ":method":
		h.f.method = f.Value
	case ":path":
		h.f.path = f.Value
	case ":authority":
		h.f.authority = f.Value
	case ":status":
		h.f.status = f.Value
	}
}
