package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
)

// Version is the protocol version this package speaks. An edge and an agent
// exchange theirs in the hello and use the lower one; an edge refuses a
// version below MinVersion.
const Version = 6

// PingVersion is the first version whose sessions keep alive with ping
// streams (StreamPing) rather than heartbeat streams (StreamHeartbeat).
const PingVersion = 3

// MoveVersion is the first version whose agents move to another edge of a
// cluster when their edge drains (GoAway.Move), and say so (OpMoved).
const MoveVersion = 4

// ReplaceVersion is the first version whose edges change an endpoint in
// place (Bind.Replaces). An edge of before it ignores the field, and would
// take such a bind as a second endpoint of the name: agents send it only
// on sessions of this version or later.
const ReplaceVersion = 5

// SessionTicketVersion is the first version whose agents renew their
// session ticket while connected (Renew.Session), so that a session that
// outlives the ticket's lifetime still has a ticket to reconnect with.
const SessionTicketVersion = 5

// AdmitVersion is the first version whose agents accept each proxy stream
// of a pooled endpoint (Bind.Pool) as soon as their app took the
// connection, with the stream's first read, before the app's first byte:
// an edge may hold a request's body, or a connection's bytes, until the
// reply comes, and send them to another member of the pool when the agent
// rejects the stream.
const AdmitVersion = 5

// PingFrameVersion is the first version whose sessions keep alive with
// PING and PONG frames (see Session.Ping) rather than ping streams: a side
// that heard nothing from its peer for an interval sends a PING frame,
// which the peer's framer answers with a PONG at once. An idle session so
// costs a frame each way per interval, and no stream, no goroutine, no
// window update (a ping stream cost eight frames, and a goroutine at each
// end). Every muxado v2 peer reads the frames as of an unknown type and
// drops them; a peer of an earlier version does not answer, so neither
// side sends them on such a session.
const PingFrameVersion = 6

// MinVersion is the oldest version an edge accepts. Version 2 added the
// reply at the start of every proxy stream, tickets and the renew request.
const MinVersion = 2

// StreamType is the first byte of every mux stream.
type StreamType uint8

// The stream types.
const (
	// StreamControl is opened by the agent for one request and its
	// response: [type][u32 length][JSON Request], answered by
	// [u32 length][JSON Response].
	StreamControl StreamType = 1
	// StreamProxy is opened by the edge for one public connection:
	// [type][u16 length][ProxyHeader], then the connection's bytes.
	StreamProxy StreamType = 2
	// StreamHeartbeat is opened by either side once per session: the opener
	// writes 8-byte pings and the other side echoes each one.
	StreamHeartbeat StreamType = 3
	// StreamGoAway is opened by the edge when it shuts down or drains:
	// [type][u32 length][JSON GoAway]. The agent expects the session to
	// end, and reconnects then; asked to move (GoAway.Move), it opens a
	// session to another edge first.
	StreamGoAway StreamType = 4
	// StreamPing is opened by either side of a version 3 session every
	// heartbeat interval: [type][u64 send time, Unix ns], then the end of
	// the stream; the other side reads it and closes it. Neither side
	// answers: each takes any frame from the other as a sign of life.
	StreamPing StreamType = 5
)

// GoAway tells an agent why the edge is going away.
type GoAway struct {
	Message string `json:"message"`
	// Move asks an agent of version MoveVersion or later to move before
	// the session ends: to open a session on another edge of the cluster,
	// bind its endpoints there with the session ticket of this one in the
	// hello (the new edge takes them over from this session at once), and
	// then send OpMoved on this session. The edge keeps serving the
	// session until its connections in flight are done. Older agents
	// ignore the field, as any unknown one.
	Move bool `json:"move,omitempty"`
}

// MaxMessage bounds a control message.
const MaxMessage = 64 << 10

// Errors of the protocol.
var (
	ErrMessageTooLarge = errors.New("wire: message too large")
	ErrMalformed       = errors.New("wire: malformed header")
	ErrMalformedReply  = errors.New("wire: malformed reply")
)

// Control operations.
const (
	OpHello  = "hello"
	OpBind   = "bind"
	OpUnbind = "unbind"
	OpRenew  = "renew"
	// OpMoved tells an edge that asked the agent to move (GoAway.Move)
	// that its endpoints are bound on another edge now, which took them
	// over from this session: the edge ends the session once the
	// connections in flight on it are done. It has no body, and is
	// answered with an empty response. Version MoveVersion and later.
	OpMoved = "moved"
	// OpHealth tells the edge that the app of an endpoint bound with
	// OptHealthCheck went up or down (Health): the edge sends it no
	// connection while it is down. Answered with an empty response, or
	// not_found for a tunnel the session does not hold. Version
	// HealthVersion and later.
	OpHealth = "health"
)

// Protocols of an endpoint.
const (
	ProtoHTTP  = "http"
	ProtoHTTPS = "https" // HTTP whose TLS the edge terminates
	ProtoTLS   = "tls"
	ProtoTCP   = "tcp"
)

// Endpoint options (Bind.Options) the edge knows. A bind with any other
// option is refused, so that an agent never believes a setting holds that
// the edge ignores.
const (
	// OptAppProtocol is the protocol the edge speaks to the app on an HTTP
	// or HTTPS endpoint's streams: AppProtocolHTTP1 (the default) or
	// AppProtocolH2C.
	OptAppProtocol = "app_protocol"

	AppProtocolHTTP1 = "http1"
	AppProtocolH2C   = "h2c" // HTTP/2 with prior knowledge, without TLS

	// OptPolicy marks a bind that carries a traffic policy (Bind.Policy),
	// with the version of the policy's format, PolicyVersion. An agent
	// sends it with every policy, so that an edge that does not enforce
	// policies refuses the bind (an unknown option) rather than ignore
	// the policy, which it would, as it ignores unknown JSON fields.
	OptPolicy     = "policy"
	PolicyVersion = "1"

	// OptVerboseErrors, "true" on an HTTP or HTTPS endpoint, shows the
	// public the detail of what went wrong (a dial error, an address) in
	// the edge's error pages, for development. An agent sends it only
	// when set: an edge that predates it refuses the bind.
	OptVerboseErrors = "verbose_errors"

	// OptPath, on an HTTP or HTTPS endpoint, is the path prefix under its
	// name that the endpoint takes ("/api", percent-encoded): the requests
	// whose cleaned path is it or under it, on segment boundaries, unless
	// an endpoint of a longer prefix takes them. An option rather than a
	// field of Bind, so that an edge that does not route by path refuses
	// the bind rather than bind the whole name. Sent only when set.
	OptPath = "path"

	// OptStripPrefix, "true" with OptPath, asks the edge to send the app
	// each request's path without the prefix, and X-Forwarded-Prefix.
	// Sent only when set.
	OptStripPrefix = "strip_prefix"

	// OptHealthCheck, "1" on any endpoint, says that the agent checks its
	// app and reports it up or down (OpHealth): the edge routes nothing to
	// it until its first report says up. An edge that predates it refuses
	// the bind.
	OptHealthCheck = "health_check"
)

// HealthVersion is the first version whose edges take OptHealthCheck and
// OpHealth.
const HealthVersion = 5

// Request is a control request from agent to edge.
type Request struct {
	Op     string  `json:"op"`
	Hello  *Hello  `json:"hello,omitempty"`
	Bind   *Bind   `json:"bind,omitempty"`
	Unbind *Unbind `json:"unbind,omitempty"`
	Renew  *Renew  `json:"renew,omitempty"`
	Health *Health `json:"health,omitempty"`
}

// Health reports the state of the app of an endpoint bound with
// OptHealthCheck.
type Health struct {
	TunnelID string `json:"tunnel_id"`
	Up       bool   `json:"up"`
	// Reason says why it is down: the check's error, for the edge's log.
	Reason string `json:"reason,omitempty"`
	// RetryAfter is how many seconds an app down takes at least to be
	// seen up again (the check's interval times its healthy_after): the
	// edge's Retry-After when every member of a pool is down. Zero: the
	// edge's default.
	RetryAfter int `json:"retry_after,omitempty"`
}

// Response answers a Request. Error is set when it failed.
type Response struct {
	Error     *Error     `json:"error,omitempty"`
	HelloResp *HelloResp `json:"hello,omitempty"`
	BindResp  *BindResp  `json:"bind,omitempty"`
	RenewResp *RenewResp `json:"renew,omitempty"`
}

// Error is a failed request: a stable code and a message for people.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Until, on a name_taken refusal of a name kept for the identity
	// that held it (the grace after its session ended, or after the
	// edge's restart), is when that keeping ends: the name is free then,
	// unless its holder binds it again. Zero: the edge does not say.
	// (Version 3 edges of before it send none; agents ignore it.)
	Until time.Time `json:"until,omitzero"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Error codes.
const (
	CodeBadRequest   = "bad_request"
	CodeVersion      = "unsupported_version"
	CodeUnauthorized = "unauthorized"
	CodeNameTaken    = "name_taken"
	CodeNotFound     = "not_found"
	CodeUnavailable  = "unavailable"
)

// Hello opens a session. It must be the first request.
type Hello struct {
	Version int    `json:"version"`
	Token   string `json:"token,omitempty"`
	Agent   string `json:"agent,omitempty"` // software name and version, for logs
	// Ticket is the session ticket of the agent's previous session, if
	// any: the new session takes over that one's endpoints.
	Ticket string `json:"ticket,omitempty"`
}

// HelloResp accepts a session.
type HelloResp struct {
	Version   int    `json:"version"`
	SessionID string `json:"session_id"`
	// Ticket is this session's ticket, to present in the hello of the
	// agent's next session.
	Ticket string `json:"ticket,omitempty"`
	// RenewAfter is how often, in seconds, the agent renews its endpoint
	// tickets; zero: never.
	RenewAfter int `json:"renew_after,omitempty"`
}

// Bind asks for a public endpoint.
type Bind struct {
	Proto string `json:"proto"` // ProtoHTTP, ProtoHTTPS, ProtoTLS or ProtoTCP
	// Name is the host name of an HTTP, HTTPS or TLS endpoint: one label under
	// the edge's domain ("abc"), or a full name or wildcard under it
	// ("abc.example.test", "*.abc.example.test"). Empty: a random label.
	Name string `json:"name,omitempty"`
	// Port is the port of a TCP endpoint; zero: any free one.
	Port int `json:"port,omitempty"`
	// Pool joins the endpoint's pool when the same identity holds it
	// already, rather than fail.
	Pool bool `json:"pool,omitempty"`
	// Options are per-endpoint settings (OptAppProtocol, OptPolicy,
	// OptVerboseErrors, OptPath, ...). The edge refuses options it does
	// not know.
	Options map[string]string `json:"options,omitempty"`
	// Policy is the endpoint's traffic policy, the JSON form of a
	// policy.Spec (package policy), sent with Options[OptPolicy] set to
	// PolicyVersion. The edge refuses a policy it cannot read or enforce
	// in full (CodeBadRequest), or cannot set up now (CodeUnavailable).
	Policy json.RawMessage `json:"policy,omitempty"`
	// Ticket is the endpoint ticket of an earlier bind of the same name,
	// which proves the agent held it (after an edge restart).
	Ticket string `json:"ticket,omitempty"`
	// Replaces, from version ReplaceVersion on, is the tunnel ID of an
	// endpoint of the session that this bind takes the place of, in one
	// step: the same protocol and name (or port), with this bind's Pool,
	// Options and Policy. The name is never free meanwhile; the old
	// endpoint's conns go on; the answer is a new tunnel ID. A bind the
	// edge refuses leaves the old endpoint as it was. Empty: a new
	// endpoint.
	Replaces string `json:"replaces,omitempty"`
}

// BindResp grants an endpoint.
type BindResp struct {
	TunnelID string `json:"tunnel_id"`
	URL      string `json:"url"`
	// Ticket proves that the agent's identity holds the endpoint's name,
	// to present when binding it again.
	Ticket string `json:"ticket,omitempty"`
}

// Unbind releases an endpoint.
type Unbind struct {
	TunnelID string `json:"tunnel_id"`
}

// Renew asks for a fresh ticket for an endpoint the session holds, or,
// with Session, for a fresh session ticket (version SessionTicketVersion
// and later; an older edge answers CodeNotFound).
type Renew struct {
	TunnelID string `json:"tunnel_id,omitempty"`
	Session  bool   `json:"session,omitempty"`
}

// RenewResp is a fresh endpoint ticket, or session ticket.
type RenewResp struct {
	Ticket string `json:"ticket"`
}

// WriteMessage writes a u32 length and v as JSON, with prefix (when not
// empty) in the same write: a mux stream's first write must not be empty.
func WriteMessage(w io.Writer, prefix []byte, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > MaxMessage {
		return ErrMessageTooLarge
	}
	buf := make([]byte, 0, len(prefix)+4+len(body))
	buf = append(buf, prefix...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(body)))
	buf = append(buf, body...)
	_, err = w.Write(buf)
	return err
}

// ReadMessage reads a message written by WriteMessage into v. The body is
// read as its bytes arrive: memory grows with what the peer sent, never
// with what its length field announces.
func ReadMessage(r io.Reader, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return err
	}
	size := int64(binary.BigEndian.Uint32(n[:]))
	if size > MaxMessage {
		return ErrMessageTooLarge
	}
	var body bytes.Buffer
	got, err := body.ReadFrom(io.LimitReader(r, size))
	if err != nil {
		return unexpected(err)
	}
	if got < size {
		return io.ErrUnexpectedEOF
	}
	if err := json.Unmarshal(body.Bytes(), v); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	return nil
}

// ProxyHeader starts every proxy stream: which endpoint the connection
// reached and who the client is.
type ProxyHeader struct {
	TunnelID string
	Proto    string         // ProtoHTTP, ProtoHTTPS, ProtoTLS, ProtoTCP
	Client   netip.AddrPort // the public client's address
	Host     string         // the HTTP Host or TLS server name, when known
}

// AppendProxyStream appends the opening bytes of a proxy stream: its type
// and h.
func AppendProxyStream(b []byte, h ProxyHeader) ([]byte, error) {
	var bb cryptobyte.Builder
	bb.AddUint8(uint8(StreamProxy))
	bb.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		addString8(b, h.TunnelID)
		addString8(b, h.Proto)
		var client []byte // empty: unknown
		if h.Client.Addr().IsValid() {
			client, _ = h.Client.MarshalBinary()
		}
		addBytes8(b, client)
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(h.Host)) })
	})
	out, err := bb.Bytes()
	if err != nil {
		return b, fmt.Errorf("wire: proxy header: %w", err)
	}
	return append(b, out...), nil
}

// ReadProxyHeader reads the header of a proxy stream whose type byte was
// already read.
func ReadProxyHeader(r io.Reader) (ProxyHeader, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return ProxyHeader{}, unexpected(err)
	}
	size := int64(binary.BigEndian.Uint16(n[:]))
	var body bytes.Buffer // grows with what arrives, not what is announced
	if got, err := body.ReadFrom(io.LimitReader(r, size)); err != nil {
		return ProxyHeader{}, unexpected(err)
	} else if got < size {
		return ProxyHeader{}, io.ErrUnexpectedEOF
	}
	return ParseProxyHeader(body.Bytes())
}

// ParseProxyHeader parses the body of a proxy header. Unknown trailing
// fields, which a later version may add, are ignored.
func ParseProxyHeader(body []byte) (ProxyHeader, error) {
	s := cryptobyte.String(body)
	var id, proto, client, host cryptobyte.String
	if !s.ReadUint8LengthPrefixed(&id) || !s.ReadUint8LengthPrefixed(&proto) ||
		!s.ReadUint8LengthPrefixed(&client) || !s.ReadUint16LengthPrefixed(&host) {
		return ProxyHeader{}, ErrMalformed
	}
	h := ProxyHeader{TunnelID: string(id), Proto: string(proto), Host: string(host)}
	if len(client) > 0 {
		if err := h.Client.UnmarshalBinary(client); err != nil {
			return ProxyHeader{}, fmt.Errorf("%w: client address: %v", ErrMalformed, err)
		}
	}
	return h, nil
}

// Reply statuses: the first byte of what an agent writes on a proxy stream.
const (
	// ReplyOK: the agent's app took the connection; its bytes follow.
	ReplyOK uint8 = 0
	// ReplyAppUnreachable: the agent could not reach its app (a refused or
	// failed dial); the stream ends after the reply.
	ReplyAppUnreachable uint8 = 1
	// ReplyNoEndpoint: the agent has no listener for the stream's tunnel
	// (it was closed); the stream ends after the reply.
	ReplyNoEndpoint uint8 = 2
	// ReplyAppDown: the endpoint's app is down, as its agent's health
	// check said (OpHealth); an edge writes it for the agent, on a relay
	// stream, without opening a stream to the agent. Readers that predate
	// it take it as ReplyAppUnreachable.
	ReplyAppDown uint8 = 3
)

// MaxReplyMessage bounds a reply's message.
const MaxReplyMessage = 1024

// Reply opens what an agent writes on a proxy stream: whether the
// connection reached its app, and why not.
type Reply struct {
	Status  uint8
	Message string // for people; empty for ReplyOK
}

// AppendReply appends a reply: u8 status, u16 length, message (cut to
// MaxReplyMessage bytes, at a character boundary).
func AppendReply(b []byte, r Reply) []byte {
	msg := r.Message
	if len(msg) > MaxReplyMessage {
		cut := MaxReplyMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	b = append(b, r.Status)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// Verdict is the agent's reply at the start of a proxy stream, read once
// by the first Read of the stream's reader (see Read).
type Verdict struct {
	rmu   sync.Mutex // held by Read: one reader of the reply at a time
	mu    sync.Mutex // guards the fields below; never held while reading
	done  bool
	err   error         // why the agent did not hand the conn to its app
	ready chan struct{} // made by Ready; closed once done
}

// Ready returns a channel closed once the reply was read; Err then says
// what it was.
func (v *Verdict) Ready() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ready == nil {
		v.ready = make(chan struct{})
		if v.done {
			close(v.ready)
		}
	}
	return v.ready
}

// Err returns the verdict read: nil for an app that took the conn (or
// none read yet), or why it did not.
func (v *Verdict) Err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}

// Read reads the reply from r the first time, and returns nil when the
// agent handed the conn to its app, an error wrapping noEndpoint, down
// (ReplyAppDown) or unreachable (and the agent's message) when it did
// not; later calls return the same verdict. A stream that broke before the
// reply is not a verdict: its error is returned as it is, and the next
// call reads again.
//
// Ready and Err do not wait for a Read under way.
func (v *Verdict) Read(r io.Reader, noEndpoint, unreachable, down error) error {
	v.rmu.Lock()
	defer v.rmu.Unlock()
	v.mu.Lock()
	done, verr := v.done, v.err
	v.mu.Unlock()
	if done {
		return verr
	}
	rep, err := ReadReply(r)
	if err != nil {
		return err
	}
	switch rep.Status {
	case ReplyOK:
	case ReplyNoEndpoint:
		verr = fmt.Errorf("%w: %s", noEndpoint, Printable(rep.Message, 200))
	case ReplyAppDown:
		verr = fmt.Errorf("%w: %s", down, Printable(rep.Message, 200))
	default:
		verr = fmt.Errorf("%w: %s", unreachable, Printable(rep.Message, 200))
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.done, v.err = true, verr
	if v.ready != nil {
		close(v.ready)
	}
	return verr
}

// ReadReply reads a reply written by AppendReply. A message longer than
// MaxReplyMessage is ErrMalformedReply.
func ReadReply(r io.Reader) (Reply, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Reply{}, unexpected(err)
	}
	n := binary.BigEndian.Uint16(h[1:])
	if n > MaxReplyMessage {
		return Reply{}, fmt.Errorf("%w: message of %d bytes", ErrMalformedReply, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return Reply{}, unexpected(err)
	}
	return Reply{Status: h[0], Message: string(msg)}, nil
}

func addString8(b *cryptobyte.Builder, s string) { addBytes8(b, []byte(s)) }

func addBytes8(b *cryptobyte.Builder, p []byte) {
	b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(p) })
}

func cmpMax(n int) int { return max(n, 0) }

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Printable returns s cut to max bytes with every byte outside printable
// ASCII replaced by '?': a string a peer sent, made safe for a log line or
// an error message.
func Printable(s string, max int) string {
	max = cmpMax(max)
	if len(s) > max {
		s = s[:max]
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

// AppendRelayStream appends the opening bytes of a relay stream, which one
// edge opens to another for a public connection to an agent the other
// holds: the agent's session id (u8 length, ASCII), then the proxy stream
// the other edge opens to the agent, type byte and header.
func AppendRelayStream(b []byte, session string, h ProxyHeader) ([]byte, error) {
	if len(session) > 255 {
		return b, fmt.Errorf("wire: relay header: session id of %d bytes", len(session))
	}
	b = append(b, byte(len(session)))
	b = append(b, session...)
	return AppendProxyStream(b, h)
}

// ReadRelayHeader reads the opening of a relay stream (see
// AppendRelayStream), as its bytes arrive.
func ReadRelayHeader(r io.Reader) (session string, h ProxyHeader, err error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", ProxyHeader{}, unexpected(err)
	}
	id := make([]byte, n[0])
	if _, err := io.ReadFull(r, id); err != nil {
		return "", ProxyHeader{}, unexpected(err)
	}
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", ProxyHeader{}, unexpected(err)
	}
	if n[0] != byte(StreamProxy) {
		return "", ProxyHeader{}, fmt.Errorf("%w: relay stream of type %d", ErrMalformed, n[0])
	}
	h, err = ReadProxyHeader(r)
	if err != nil {
		return "", ProxyHeader{}, err
	}
	return string(id), h, nil
}
