package events

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSServer is a one-node NATS server with JetStream inside this process:
// the server's own library (nats-server/v2/server), the same code as the
// nats-server binary. It is the broker of `make run` when nothing answers at
// NATS_URL, and of the tests on a machine without a NATS server; a real
// deployment sets NATS_URL.
type NATSServer struct {
	srv     *server.Server
	storeIn string
	tempDir bool // storeIn was made here and goes with Close
}

// NATSServerConfig says where the embedded server listens and keeps its
// streams.
type NATSServerConfig struct {
	// Addr is a loopback host:port; port 0 picks a free one.
	Addr string
	// DataDir keeps JetStream's streams and consumers across restarts. ""
	// makes a temporary folder, removed by Close.
	DataDir string
}

// StartNATSServer starts the embedded server and waits until it accepts
// connections.
func StartNATSServer(cfg NATSServerConfig) (*NATSServer, error) {
	host, portText, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("events: nats server address %q: %w", cfg.Addr, err)
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("events: the embedded nats server listens on loopback only, not %q: set NATS_URL to a real server", host)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("events: nats server port %q: %w", portText, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s := &NATSServer{storeIn: cfg.DataDir}
	if s.storeIn == "" {
		if s.storeIn, err = os.MkdirTemp("", "idemlab-nats-"); err != nil {
			return nil, fmt.Errorf("events: nats server: %w", err)
		}
		s.tempDir = true
	}
	s.srv, err = server.NewServer(&server.Options{
		ServerName: "idemlab-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   s.storeIn,
		NoSigs:     true, // the app handles its own signals
		NoLog:      true,
	})
	if err != nil {
		s.removeTemp()
		return nil, fmt.Errorf("events: nats server: %w", err)
	}
	s.srv.Start()
	if !s.srv.ReadyForConnections(10 * time.Second) {
		s.Close()
		return nil, fmt.Errorf("events: the embedded nats server did not accept connections on %s within 10s", cfg.Addr)
	}
	return s, nil
}

// URL is the nats:// URL clients dial.
func (s *NATSServer) URL() string { return s.srv.ClientURL() }

// DataDir is the folder holding JetStream's streams.
func (s *NATSServer) DataDir() string { return s.storeIn }

// Close stops the server (JetStream flushes its files) and removes a
// temporary store.
func (s *NATSServer) Close() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.removeTemp()
}

func (s *NATSServer) removeTemp() {
	if s.tempDir {
		os.RemoveAll(s.storeIn)
	}
}
