package events

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaBroker is a one-node Kafka cluster inside this process: franz-go's
// kfake, which speaks the Kafka wire protocol (produce, fetch, consumer
// groups, offset commits, idempotent producers) to real clients. It is the
// broker of `make run` and of the tests, so the Kafka transport runs without
// Docker; KAFKA_BROKERS points the app at a real cluster instead.
type KafkaBroker struct {
	cluster *kfake.Cluster
	addr    string
}

// KafkaBrokerConfig says where the embedded broker listens and keeps its log.
type KafkaBrokerConfig struct {
	// Addr is a loopback host:port; port 0 picks a free one. kfake listens
	// on loopback only: across machines, use a real cluster.
	Addr string
	// DataDir keeps the log, the topics and the groups' committed offsets
	// across restarts ("" keeps them in memory: they die with the process).
	DataDir string
	// MinSessionTimeout is the shortest group session the broker allows.
	// Default 1s (Kafka's own is 6s), so tests can hand a killed member's
	// partitions on quickly.
	MinSessionTimeout time.Duration
}

// StartKafkaBroker starts the embedded broker.
func StartKafkaBroker(cfg KafkaBrokerConfig) (*KafkaBroker, error) {
	host, portText, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("events: kafka broker address %q: %w", cfg.Addr, err)
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("events: the embedded kafka broker listens on loopback only, not %q: set KAFKA_BROKERS to a real cluster", host)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("events: kafka broker port %q: %w", portText, err)
	}
	if cfg.MinSessionTimeout == 0 {
		cfg.MinSessionTimeout = time.Second
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ClusterID("idemlab"),
		kfake.GroupMinSessionTimeout(cfg.MinSessionTimeout),
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir), kfake.SyncWrites()) // an acked produce is on disk
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("events: kafka broker: %w", err)
	}
	return &KafkaBroker{cluster: c, addr: c.ListenAddrs()[0]}, nil
}

// Addr is the host:port clients dial (a seed broker).
func (b *KafkaBroker) Addr() string { return b.addr }

// Close stops the broker (and, with a DataDir, flushes its log).
func (b *KafkaBroker) Close() { b.cluster.Close() }
