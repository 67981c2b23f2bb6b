package inspect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// replayKey is the context key of a replayed request's replayInfo.
type replayKey struct{}

// replayInfo marks a request as in's replay of exchange of, and gets the
// replay's own exchange when it ends.
type replayInfo struct {
	in     *Inspector
	of     uint64
	result *entry
}

// replayEdit is the JSON body of a replay: the members given replace the
// recorded request's.
type replayEdit struct {
	Method *string      `json:"method"`
	URL    *string      `json:"url"`
	Host   *string      `json:"host"`
	Header *http.Header `json:"header"`
	Body   *string      `json:"body"`
}

// replayError is a replay refused before it started, with the HTTP
// status that says why.
type replayError struct {
	status int
	msg    string
}

func (e *replayError) Error() string { return "replay: " + e.msg }

// replay sends e's request again, as edit changes it, through the
// forwarder that recorded it, for client, and returns the exchange it
// recorded, when the response has ended or ctx is done.
func (in *Inspector) replay(ctx context.Context, e *entry, edit *replayEdit, client string) (*Exchange, error) {
	x := &e.ex
	r, err := replayRequest(e, edit)
	if err != nil {
		return nil, err
	}
	if e.replay == nil {
		return nil, &replayError{http.StatusConflict, fmt.Sprintf("exchange %d was recorded by a forwarder that does not replay", x.ID)}
	}
	r.RemoteAddr = client
	ri := &replayInfo{in: in, of: x.ID}
	r = r.WithContext(context.WithValue(ctx, replayKey{}, ri))
	if err := e.replay(r); err != nil {
		if errors.Is(err, http.ErrServerClosed) {
			return nil, &replayError{http.StatusServiceUnavailable, fmt.Sprintf("the forwarder that recorded exchange %d has stopped", x.ID)}
		}
		return nil, err
	}
	if ri.result == nil {
		return nil, errors.New("replay: the forwarder records with another inspector")
	}
	return &ri.result.ex, nil
}

// replayRequest is the request that replays e as edit changes it: the
// recorded one where edit gives nothing, refused when what it would take
// was not kept whole, or when an edited part is not valid HTTP.
func replayRequest(e *entry, edit *replayEdit) (*http.Request, error) {
	x := &e.ex
	method, uri, host, header, body := x.Method, x.URL, x.Host, x.RequestHeader, x.RequestBody.Data
	if edit.Method != nil {
		method = *edit.Method
	}
	if edit.URL != nil {
		uri = *edit.URL
	}
	if edit.Host != nil {
		host = *edit.Host
	}
	if edit.Header != nil {
		header = *edit.Header
	} else if x.HeaderTruncated {
		return nil, &replayError{http.StatusConflict, fmt.Sprintf("exchange %d's URL and headers were longer than the %d bytes kept: give them", x.ID, headLimit)}
	}
	if edit.Body != nil {
		body = []byte(*edit.Body)
	} else if e.body && !x.Done {
		return nil, &replayError{http.StatusConflict, fmt.Sprintf("exchange %d is under way: its request body is known when it is done; or give a body", x.ID)}
	} else if x.RequestBody.Truncated {
		return nil, &replayError{http.StatusConflict, fmt.Sprintf("exchange %d's request body had %d bytes, of which %d are kept: give a body", x.ID, x.RequestBody.Size, len(x.RequestBody.Data))}
	}

	if !httpguts.ValidHeaderFieldName(method) { // a token, as a method is
		return nil, &replayError{http.StatusBadRequest, fmt.Sprintf("method %q is not a token", method)}
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || !strings.HasPrefix(uri, "/") {
		return nil, &replayError{http.StatusBadRequest, fmt.Sprintf("URL %q is not a path and query", uri)}
	}
	if !httpguts.ValidHostHeader(host) {
		return nil, &replayError{http.StatusBadRequest, fmt.Sprintf("host %q is not valid", host)}
	}
	h := make(http.Header, len(header))
	for k, vv := range header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, &replayError{http.StatusBadRequest, fmt.Sprintf("header field name %q is not valid", k)}
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, &replayError{http.StatusBadRequest, fmt.Sprintf("header field %s: value %q is not valid", k, v)}
			}
		}
		h[http.CanonicalHeaderKey(k)] = append([]string(nil), vv...)
	}
	// The body's length is the replay's own.
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	r := &http.Request{
		Method:        method,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Host:          host,
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
	}
	if len(body) > 0 {
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return r, nil
}
