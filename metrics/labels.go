package metrics

// other is the label value of anything outside a label's known set.
const other = "other"

// protos are the protocols the core reports, in the order of the arrays
// protoIndex indexes.
var protos = [...]string{"http", "https", "tls", "tcp"}

const nProtos = len(protos)

// protoIndex returns the index of proto in protos, or -1.
func protoIndex(proto string) int {
	switch proto {
	case "http":
		return 0
	case "https":
		return 1
	case "tls":
		return 2
	case "tcp":
		return 3
	}
	return -1
}

// classes are the status classes of HTTP responses, indexed by
// classIndex.
var classes = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// classIndex returns the index in classes of status's class, or -1 for a
// status outside 100-599 (0: no response was sent).
func classIndex(status int) int {
	if status < 100 || status > 599 {
		return -1
	}
	return status/100 - 1
}
