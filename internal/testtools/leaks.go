package testtools

import (
	"net"
	"net/http"
	"regexp"
	"strings"
)

// Leaks returns what an error answer's public client can read (its
// header and body) of the detail behind it, which is for logs only: an
// IP address, the port of one of addrs, the words of a dial, TLS or
// certificate error or of a stack trace, or the text of one of causes
// (the errors as Go wrote them). None: nil. The answer's request ID,
// Date and Content-Length are not searched: they are made of digits that
// a port may match by chance.
func Leaks(header http.Header, body string, addrs []string, causes ...string) []string {
	id := header.Get("Tunnelkit-Request-Id")
	var b strings.Builder
	for k, vv := range header {
		switch k {
		case "Date", "Content-Length", "Tunnelkit-Request-Id":
			continue
		}
		b.WriteString(k + ": " + strings.Join(vv, ", ") + "\n")
	}
	b.WriteString(body)
	text := b.String()
	if id != "" {
		text = strings.ReplaceAll(text, id, "ID")
	}
	var leaks []string
	for _, m := range ipAddress.FindAllString(text, -1) {
		leaks = append(leaks, "an IP address: "+m)
	}
	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err == nil && regexp.MustCompile(`\b`+port+`\b`).MatchString(text) {
			leaks = append(leaks, "the port of "+a)
		}
	}
	lower := strings.ToLower(text)
	for _, w := range detailWords {
		if strings.Contains(lower, w) {
			leaks = append(leaks, "the words "+w)
		}
	}
	for _, c := range causes {
		if c != "" && strings.Contains(text, c) {
			leaks = append(leaks, "the cause's text "+c)
		}
	}
	return leaks
}

// ipAddress matches an IPv4 address, an IPv6 address in brackets (as a
// host:port has it) and one with "::" in it.
var ipAddress = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}\b|\[[0-9a-fA-F:.]+\]|[0-9a-fA-F]*::[0-9a-fA-F:]*[0-9a-fA-F]`)

// detailWords are words of Go's errors that no page says for itself.
var detailWords = []string{"dial", "x509", "connect:", "tls:", "connection refused", "goroutine ", ".go:", "tcp ", "127.0.0.1", "[::1]"}
