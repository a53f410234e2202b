package testenv_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"krane.dev/internal/testenv"
)

// echo serves a line echo on a free port.
func echo(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return l.Addr().String()
}

func roundTrip(c net.Conn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxyCutStallRestore(t *testing.T) {
	p, err := testenv.NewProxy(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c, time.Second); err != nil {
		t.Fatalf("pass-through: %v", err)
	}
	p.Stall()
	if err := roundTrip(c, 300*time.Millisecond); err == nil {
		t.Fatal("bytes flowed through a stalled proxy")
	}
	p.Restore()
	c2, _ := net.Dial("tcp", p.Addr())
	if err := roundTrip(c2, time.Second); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	p.Cut()
	if err := roundTrip(c2, time.Second); err == nil {
		t.Fatal("a cut connection still works")
	}
	if c3, err := net.Dial("tcp", p.Addr()); err == nil {
		if roundTrip(c3, 300*time.Millisecond) == nil {
			t.Fatal("a new connection works while cut")
		}
	}
	p.Restore()
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil || roundTrip(c4, time.Second) != nil {
		t.Fatalf("after restoring a cut: %v", err)
	}
}
