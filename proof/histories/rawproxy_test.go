package histories_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/proof/histories"
)

// echoServer accepts connections on 127.0.0.1 and echoes every line back.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func rawProxy(t *testing.T) (*histories.Proxy, net.Conn) {
	t.Helper()
	p, err := histories.NewProxy(echoServer(t), histories.ProxyOptions{Raw: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Dial returns once the kernel has accepted; the proxy registers the connection a moment later, on its accept
	// goroutine. A fault aimed at every connection must wait for that. The test's connection is counted by its
	// address: a stray dial to a recycled port would be another.
	for deadline := time.Now().Add(5 * time.Second); p.ConnectionsFrom(c.LocalAddr()) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy holds %d connections from the test's address after a dial (%d in all), want 1",
				p.ConnectionsFrom(c.LocalAddr()), p.Connections())
		}
		time.Sleep(time.Millisecond)
	}
	return p, c
}

// roundTrip writes a line and reads it back within d.
func roundTrip(c net.Conn, line string, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	s, err := bufio.NewReader(c).ReadString('\n')
	return s, err
}

// TestRawProxyFaults checks the raw proxy (for a broker) forwards bytes, holds them in a black hole until healed,
// gives end of stream on a half-open connection and resets cut ones.
func TestRawProxyFaults(t *testing.T) {
	t.Run("forwards", func(t *testing.T) {
		_, c := rawProxy(t)
		if s, err := roundTrip(c, "hello", 5*time.Second); err != nil || s != "hello\n" {
			t.Fatalf("echo through the proxy: %q, %v", s, err)
		}
	})
	t.Run("black hole until healed", func(t *testing.T) {
		p, c := rawProxy(t)
		p.BlackHole(histories.Both)
		if _, err := roundTrip(c, "held", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a read through a black hole: %v, want the deadline", err)
		}
		p.Heal()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		s, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || s != "held\n" {
			t.Fatalf("after healing: %q, %v; want what was held", s, err)
		}
	})
	t.Run("half-open", func(t *testing.T) {
		p, c := rawProxy(t)
		if n := p.HalfOpen(); n < 1 {
			t.Fatalf("half-opened %d connections, want the test's", n)
		}
		if _, err := roundTrip(c, "x", 5*time.Second); !errors.Is(err, io.EOF) {
			t.Fatalf("read on a half-open connection: %v, want end of stream", err)
		}
	})
	t.Run("cut", func(t *testing.T) {
		p, c := rawProxy(t)
		if n := p.CutAll(); n < 1 {
			t.Fatalf("cut %d connections, want the test's", n)
		}
		if _, err := roundTrip(c, "x", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read on a cut connection: %v, want a reset or end of stream", err)
		}
	})
	t.Run("cut mid-stream", func(t *testing.T) {
		p, c := rawProxy(t)
		p.CutMidStream()
		s, err := roundTrip(c, "0123456789", 5*time.Second)
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || s == "0123456789\n" {
			t.Fatalf("read of a chunk cut halfway: %q, %v; want part of it and a lost connection", s, err)
		}
		if st := p.Stats(); st.CutMidStream != 1 {
			t.Fatalf("%d chunks cut, want 1", st.CutMidStream)
		}
	})
}
