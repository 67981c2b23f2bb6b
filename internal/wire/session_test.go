package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"
)

// sessionPair returns a session pair over loopback TCP: the client's end
// a Session, the server's a Session (as a muxado.Session: see asMuxado)
// or, with stockServer, a stock muxado session.
func sessionPair(t *testing.T, stockServer bool) (*Session, muxado.Session) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("accept failed")
	}
	client := NewSession(cc, MinWindow, true, 0)
	var server muxado.Session
	if stockServer {
		server = muxado.Server(sc, &muxado.Config{MaxWindowSize: MinWindow})
	} else {
		server = asMuxado{NewSession(sc, MinWindow, false, 0)}
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// asMuxado is a Session as a muxado.Session: its OpenStream and
// AcceptStream return its own streams.
type asMuxado struct{ *Session }

func (s asMuxado) OpenStream() (muxado.Stream, error) {
	st, err := s.Session.OpenStream()
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (s asMuxado) AcceptStream() (muxado.Stream, error) {
	st, err := s.Session.AcceptStream()
	if err != nil {
		return nil, err
	}
	return st, nil
}

// acceptStream returns the next stream server accepts, within 5 s.
func acceptStream(t *testing.T, server muxado.Session) muxado.Stream {
	t.Helper()
	got := make(chan muxado.Stream, 1)
	go func() {
		st, err := server.AcceptStream()
		if err != nil {
			close(got)
			return
		}
		got <- st
	}()
	select {
	case st := <-got:
		if st == nil {
			t.Fatal("accept failed")
		}
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("no stream accepted")
	}
	return nil
}

// TestCloseDoesNotWaitForAStalledWrite: a write waits for window because
// the peer stopped reading (an app that answered without reading an
// upload). Close returns at once, the write fails, and the peer's stream
// ends, whether the peer is a Session or a stock muxado session.
func TestCloseDoesNotWaitForAStalledWrite(t *testing.T) {
	for _, stock := range []bool{false, true} {
		name := map[bool]string{false: "Session peer", true: "stock muxado peer"}[stock]
		t.Run(name, func(t *testing.T) {
			client, server := sessionPair(t, stock)
			st, err := client.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			wrote := make(chan error, 1)
			go func() {
				_, err := st.Write(make([]byte, 4*MinWindow)) // far past the window
				wrote <- err
			}()
			peer := acceptStream(t, server)
			// The peer reads nothing: the write, four windows long, cannot
			// end before the peer reads. Close once it is under way.
			waitWriting(t, st)

			closed := make(chan struct{})
			go func() {
				st.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("Close waited behind the stalled write")
			}
			select {
			case err := <-wrote:
				if err == nil {
					t.Fatal("the stalled write succeeded after Close")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stalled write never returned after Close")
			}
			// The peer's stream is over: reading ends with an error or EOF
			// once what arrived before the reset is read, not never.
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, peer)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the peer's stream stayed open after the reset")
			}
		})
	}
}

// TestResetEndsThePeersStalledWrite: the peer writes more than the window
// and this side never reads; Reset makes the peer's write fail, and this
// side's reads fail at once.
func TestResetEndsThePeersStalledWrite(t *testing.T) {
	client, server := sessionPair(t, true)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	peer := acceptStream(t, server)
	wrote := make(chan error, 1)
	go func() {
		_, err := peer.Write(make([]byte, 4*MinWindow))
		wrote <- err
	}()
	readErr := make(chan error, 1)
	go func() {
		var b [1]byte
		for {
			if _, err := st.Read(b[:]); err != nil {
				readErr <- err
				return
			}
		}
	}()
	st.Reset()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the peer's stalled write succeeded after the reset")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's stalled write never returned after the reset")
	}
	select {
	case <-readErr:
	case <-time.After(5 * time.Second):
		t.Fatal("a read on the reset stream never returned")
	}
	if _, err := st.Write([]byte("x")); err == nil {
		t.Fatal("a write after Reset succeeded")
	}
}

// TestCloseWithoutWritersIsGraceful: a stream closed with no write under
// way ends as muxado's Close ends it: the peer reads every byte, then EOF.
func TestCloseWithoutWritersIsGraceful(t *testing.T) {
	client, server := sessionPair(t, false)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("tunnelkit"), 1000)
	if _, err := st.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	peer := acceptStream(t, server)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the peer read %d bytes, want %d", len(got), len(want))
	}
}

// waitWriting waits until a write of st is under way.
func waitWriting(t *testing.T, st *Stream) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st.mu.Lock()
		n := st.writers
		st.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the write never started")
		}
		time.Sleep(time.Millisecond)
	}
}
