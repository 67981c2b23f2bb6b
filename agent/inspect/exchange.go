package inspect

import (
	"net/http"
	"time"
)

// Exchange is an HTTP request that went through a forwarder, and its
// response, as an [Inspector] recorded them. Its JSON form is what the
// Inspector's API serves.
type Exchange struct {
	// ID numbers the exchanges an Inspector recorded, from 1.
	ID uint64 `json:"id"`

	// ReplayOf is the ID of the exchange that this one replayed. Zero:
	// the request came from a client.
	ReplayOf uint64 `json:"replay_of,omitempty"`

	// Done is set when the response has ended (or failed). Until then
	// Duration is zero, the bodies are not known, and Status, until the
	// response's header is, is zero.
	Done bool `json:"done"`

	// Start is when the request arrived; Duration how long until its
	// response ended.
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration_ns"`

	// Client is the address of the client: the public client's, for a
	// request through the tunnel; the inspector page's, for a replay.
	Client string `json:"client"`

	// To is the address of the app: the forwarder's.
	To string `json:"to"`

	// Method, Host, URL (the path and query, as sent) and Proto
	// ("HTTP/1.1") are those of the request.
	Method string `json:"method"`
	Host   string `json:"host"`
	URL    string `json:"url"`
	Proto  string `json:"proto"`

	// RequestHeader is the request's header as the forwarder got it and
	// passed it on, names in canonical form; Host is not in it.
	RequestHeader http.Header `json:"request_header,omitempty"`
	RequestBody   Body        `json:"request_body"`

	// Status is the response's final status (not a 1xx but 101), 502
	// when the forwarder answered for an app it could not reach (the
	// Tunnelkit-Error header says why), zero when the request failed
	// before any response.
	Status int `json:"status"`

	// ResponseHeader is the response's header as the app sent it.
	ResponseHeader http.Header `json:"response_header,omitempty"`
	ResponseBody   Body        `json:"response_body"`

	// HeaderTruncated is set when the URL and the headers together were
	// longer than the 64 KiB kept of them: fields are missing.
	HeaderTruncated bool `json:"header_truncated,omitempty"`

	// Error, when not empty, says why the exchange failed: "aborted" when
	// the response broke off (the app's side or the client's ended in
	// the middle of it), or never came (an app that closes a kept-alive
	// connection as the request goes out: the edge sends an idempotent
	// request again, another exchange); for a 502 that the forwarder
	// answered for the app, its code and the detail the client was not
	// shown ("app_unreachable: dial tcp 127.0.0.1:3000: connect:
	// connection refused").
	Error string `json:"error,omitempty"`

	// RequestID is the request ID of a 502 that the forwarder answered
	// for the app (its Tunnelkit-Request-Id header), under which the
	// agent's log has the detail too. Empty for the app's answers.
	RequestID string `json:"request_id,omitempty"`
}

// Body is what an Exchange keeps of a request's or response's body: the
// first bytes, up to the Inspector's BodyLimit.
type Body struct {
	// Data holds the first bytes of the body (base64 in JSON).
	Data []byte `json:"data,omitempty"`

	// Size counts the body's bytes that went through, all of them.
	Size int64 `json:"size"`

	// Truncated is set when Data holds fewer bytes than Size.
	Truncated bool `json:"truncated,omitempty"`
}
