package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// The pages say why a broker is away in words a reader can act on, never
// a client's error text (issue 29: the banner quoted "nats: …" and "dial
// tcp …"). Every transport's client error reads as one of a few causes.
func TestBrokerCauseSaysItInWords(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  error
		want string
	}{
		{refused, "connection is refused"},
		{fmt.Errorf("kafka: create topic: %w", refused), "connection is refused"},
		{errors.New("unable to dial: dial tcp 127.0.0.1:1: connect: connection refused"), "connection is refused"},
		{&net.DNSError{Err: "no such host", Name: "nats.invalid"}, "does not resolve"},
		{context.DeadlineExceeded, "does not answer in time"},
		{errors.New("nats: no responders available for request"), "JetStream is not enabled"},
		{io.EOF, "connection was closed"},
		{errors.New("something else entirely: 0xdeadbeef"), "the log has it"},
		{nil, "no reason given"},
	} {
		got := BrokerCause(c.err)
		if !strings.Contains(got, c.want) {
			t.Errorf("BrokerCause(%v) = %q, want it to say %q", c.err, got, c.want)
		}
		if c.err != nil && strings.Contains(got, c.err.Error()) {
			t.Errorf("BrokerCause(%v) quotes the error: %q", c.err, got)
		}
		for _, raw := range []string{"dial", "tcp", "nats:", "0x", "syscall"} {
			if strings.Contains(got, raw) {
				t.Errorf("BrokerCause(%v) = %q: says %q", c.err, got, raw)
			}
		}
	}
	s := NewBrokerState("NATS", "nats://127.0.0.1:1")
	s.Away(refused)
	if st := s.Status(); !st.Away || st.Why != BrokerCause(refused) {
		t.Errorf("state after Away: %+v", st)
	}
	if st := NewBrokerElsewhere().Status(); !st.Away || !st.Elsewhere {
		t.Errorf("a process without a relay: %+v, want away elsewhere", st)
	}
}
