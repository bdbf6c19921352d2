package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemlab/idemlab/internal/events"
)

// Without NATS_URL and with nothing answering at its default, the process
// runs the embedded NATS server there, says so, and JetStream works on it;
// another process then finds it answering and uses it; a NATS_URL asked
// for is never replaced.
func TestNoNATSAnsweringRunsTheEmbeddedServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := fmt.Sprintf("nats://%s", ln.Addr())
	ln.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	cfg := eventsConfig{Transport: events.TransportNATS, NATSEmbed: true, NATSURL: closedURL, NATSDataDir: t.TempDir()}
	note, stop, err := embedNATS(&cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.Contains(note, "embedded NATS server") || !strings.Contains(note, cfg.NATSDataDir) {
		t.Errorf("the Events page's note = %q, want it to name the embedded server and its folder", note)
	}
	nc, err := nats.Connect(cfg.NATSURL)
	if err != nil {
		t.Fatalf("connect to the embedded server at %s: %v", cfg.NATSURL, err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := events.NewNATS(ctx, nc, events.NATSConfig{Stream: "EMBEDDED_TEST", Subject: "embedded_test"}); err != nil {
		t.Fatalf("JetStream on the embedded server: %v", err)
	}

	second := eventsConfig{Transport: events.TransportNATS, NATSEmbed: true, NATSURL: closedURL}
	if note, stop, err := embedNATS(&second, logger); err != nil || note != "" || second.NATSURL != closedURL {
		t.Errorf("with the embedded server answering, a second process embedded again: %q %v (url %s)", note, err, second.NATSURL)
	} else {
		stop()
	}
	asked := eventsConfig{Transport: events.TransportNATS, NATSEmbed: false, NATSURL: "nats://127.0.0.1:1"}
	if note, stop, err := embedNATS(&asked, logger); err != nil || note != "" || asked.NATSURL != "nats://127.0.0.1:1" {
		t.Errorf("NATS_URL asked for was replaced: %q %v (url %s)", note, err, asked.NATSURL)
	} else {
		stop()
	}
}
