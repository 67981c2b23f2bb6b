package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tunnelkit/tunnelkit/internal/suggest"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Parse reads a spec's JSON form, strictly: a kind this package does not
// know is ErrUnknownKind, naming it; an unknown field inside a kind, a
// member given twice, a name in another case than its own, trailing data,
// or input over MaxSpecBytes are ErrInvalid (ErrTooLarge for the size).
// "null" and "{}" are the zero Spec. Parse checks the form only; Validate
// checks the values against a protocol and the bounds.
func Parse(data []byte) (Spec, error) {
	var s Spec
	if len(data) > MaxSpecBytes {
		return s, fmt.Errorf("%w: %d bytes of JSON (at most %d)", ErrTooLarge, len(data), MaxSpecBytes)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		if errors.Is(err, ErrUnknownKind) || errors.Is(err, ErrInvalid) {
			return Spec{}, err
		}
		return Spec{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return s, nil
}

// UnmarshalJSON reads s as Parse does (without Parse's size bound): a Spec
// inside a caller's own configuration is read as strictly.
func (s *Spec) UnmarshalJSON(data []byte) error {
	type plain Spec
	// The phases are read apart, so that their errors name the rule: the
	// shallower fields take their members.
	var p struct {
		plain
		OnTCPConnect   json.RawMessage `json:"on_tcp_connect"`
		OnHTTPRequest  json.RawMessage `json:"on_http_request"`
		OnHTTPResponse json.RawMessage `json:"on_http_response"`
	}
	if err := decodeStrict(data, "", specFields, &p); err != nil {
		return err
	}
	out := Spec(p.plain)
	var err error
	if out.OnTCPConnect, err = parsePhase(PhaseTCPConnect, p.OnTCPConnect); err != nil {
		return err
	}
	if out.OnHTTPRequest, err = parsePhase(PhaseHTTPRequest, p.OnHTTPRequest); err != nil {
		return err
	}
	if out.OnHTTPResponse, err = parsePhase(PhaseHTTPResponse, p.OnHTTPResponse); err != nil {
		return err
	}
	*s = out
	return nil
}

// UnmarshalJSON reads b strictly, as Parse does.
func (b *BasicAuth) UnmarshalJSON(data []byte) error {
	type plain BasicAuth
	return decodeStrict(data, KindBasicAuth, basicAuthFields, (*plain)(b))
}

// UnmarshalJSON reads o strictly, as Parse does.
func (o *OIDC) UnmarshalJSON(data []byte) error {
	type plain OIDC
	return decodeStrict(data, KindOIDC, oidcFields, (*plain)(o))
}

// UnmarshalJSON reads m strictly, as Parse does.
func (m *MutualTLS) UnmarshalJSON(data []byte) error {
	type plain MutualTLS
	return decodeStrict(data, KindMutualTLS, mutualTLSFields, (*plain)(m))
}

// UnmarshalJSON reads r strictly, as Parse does.
func (r *RateLimit) UnmarshalJSON(data []byte) error {
	type plain RateLimit
	return decodeStrict(data, KindRateLimit, rateLimitFields, (*plain)(r))
}

// UnmarshalJSON reads h strictly, as Parse does. The kind's name in errors
// is "headers": the same type serves request_headers and response_headers.
func (h *Headers) UnmarshalJSON(data []byte) error {
	type plain Headers
	return decodeStrict(data, "headers", headersFields, (*plain)(h))
}

// UnmarshalJSON reads w strictly, as Parse does.
func (w *Webhook) UnmarshalJSON(data []byte) error {
	type plain Webhook
	return decodeStrict(data, KindWebhook, webhookFields, (*plain)(w))
}

// The JSON member names of each type, from its struct tags: the one place
// they are written is the type itself.
var (
	specFields      = jsonFields(reflect.TypeFor[Spec]())
	basicAuthFields = jsonFields(reflect.TypeFor[BasicAuth]())
	oidcFields      = jsonFields(reflect.TypeFor[OIDC]())
	mutualTLSFields = jsonFields(reflect.TypeFor[MutualTLS]())
	rateLimitFields = jsonFields(reflect.TypeFor[RateLimit]())
	headersFields   = jsonFields(reflect.TypeFor[Headers]())
	webhookFields   = jsonFields(reflect.TypeFor[Webhook]())
)

func jsonFields(t reflect.Type) map[string]bool {
	m := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		m[name] = true
	}
	return m
}

// decodeStrict checks that data is a JSON object (or null) whose member
// names are exactly names of known, each at most once, then decodes it
// into v. kind is "" for the spec itself, whose members are kinds.
func decodeStrict(data []byte, kind string, known map[string]bool, v any) error {
	if err := checkMembers(data, kind, known); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		if errors.Is(err, ErrUnknownKind) || errors.Is(err, ErrInvalid) {
			return err
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// Say where, without quoting the value (it may be a secret).
			return fmt.Errorf("%w: %s: want %s", ErrInvalid, where(kind, te.Field), te.Type)
		}
		return fmt.Errorf("%w: %s: %v", ErrInvalid, where(kind, ""), err)
	}
	return nil
}

func where(kind, field string) string {
	switch {
	case kind == "" && field == "":
		return "policy"
	case kind == "":
		return field
	case field == "":
		return kind
	}
	return kind + "." + field
}

// checkMembers reads the member names of the object in data.
func checkMembers(data []byte, kind string, known map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, where(kind, ""), err)
	}
	if tok == nil {
		return nil // null
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%w: %s: want a JSON object", ErrInvalid, where(kind, ""))
	}
	seen := make(map[string]bool, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, where(kind, ""), err)
		}
		name, _ := tok.(string)
		switch {
		case !known[name] && kind == "":
			return fmt.Errorf("%w %s%s", ErrUnknownKind, quote(name), didYouMean(name, known))
		case !known[name]:
			return fmt.Errorf("%w: %s: unknown field %s%s", ErrInvalid, kind, quote(name), didYouMean(name, known))
		case seen[name]:
			return fmt.Errorf("%w: %s: %s given twice", ErrInvalid, where(kind, ""), name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, where(kind, name), err)
		}
	}
	return nil
}

// didYouMean names the one of known that name was likely meant to be:
// ": did you mean \"cidr_allow\"?", or "".
func didYouMean(name string, known map[string]bool) string {
	if near := suggest.Closest(name, slices.Collect(maps.Keys(known))); near != "" {
		return fmt.Sprintf(": did you mean %q?", near)
	}
	return ""
}

// quote quotes a name a peer sent, cut to 64 bytes, for an error message.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.QuoteToASCII(s)
}
