//go:build !unix

package wire

// rawReading is empty where sockets are not read through their RawConn:
// every conn is read with its own Read.
type rawReading struct{}

func (rawReading) ok() bool { return false }

func (c *connReader) initRaw() bool { return false }

func (c *connReader) rawFill() {}
