package events_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/testenv"
)

// natsCluster is three nats-servers of the test's own, routed to each other
// as one JetStream cluster (Debian's nats-server, on free ports).
type natsCluster struct {
	t     testing.TB
	nodes []*natsNode
}

type natsNode struct {
	name         string
	port, routes int
	store        string
	cmd          *exec.Cmd
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startNATSCluster(t testing.TB, n int) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t}
	for i := range n {
		c.nodes = append(c.nodes, &natsNode{name: fmt.Sprintf("n%d", i+1),
			port: freeTCPPort(t), routes: freeTCPPort(t), store: t.TempDir()})
	}
	for _, node := range c.nodes {
		c.start(node)
	}
	t.Cleanup(func() {
		for _, node := range c.nodes {
			c.kill(node)
		}
	})
	// JetStream answers once the cluster has elected its meta leader.
	waitFor(t, 30*time.Second, "the JetStream cluster to elect a leader", func() bool {
		nc, err := nats.Connect(c.url())
		if err != nil {
			return false
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
	return c
}

// url lists every node: the client moves to another when one dies.
func (c *natsCluster) url() string {
	var urls []string
	for _, node := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", node.port))
	}
	return strings.Join(urls, ",")
}

func (c *natsCluster) start(node *natsNode) {
	c.t.Helper()
	var routes []string
	for _, other := range c.nodes {
		if other != node {
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", other.routes))
		}
	}
	node.cmd = exec.Command("/usr/sbin/nats-server", "-n", node.name, "-a", "127.0.0.1", "-p", fmt.Sprint(node.port),
		"-js", "-sd", node.store, "--cluster_name", "idemlab", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", node.routes),
		"--routes", strings.Join(routes, ","))
	node.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := node.cmd.Start(); err != nil {
		c.t.Fatalf("nats-server: %v", err)
	}
}

func (c *natsCluster) kill(node *natsNode) {
	if node.cmd != nil && node.cmd.Process != nil {
		node.cmd.Process.Kill()
		node.cmd.Wait()
		node.cmd = nil
	}
}

func (c *natsCluster) node(name string) *natsNode {
	for _, node := range c.nodes {
		if node.name == name {
			return node
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// A JetStream cluster of three, the stream and its consumers on all three
// (EVENTS_REPLICAS=3). While events flow, the stream's leader is killed
// (SIGKILL): the relay's publishes fail or wait until a new leader is
// elected and then resume on their own; every event is applied exactly
// once by each consumer, none lost.
func TestJetStreamClusterLosesItsLeaderNothingLost(t *testing.T) {
	testenv.SkipIfShort(t, "starts a three-node NATS cluster")
	t.Parallel()
	cluster := startNATSCluster(t, 3)
	b := setupNATS(t, cluster.url(), events.NATSConfig{Replicas: 3, PublishTimeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay := b.relay(t, events.RelayConfig{Interval: 100 * time.Millisecond, Backoff: 100 * time.Millisecond,
		MaxBackoff: 500 * time.Millisecond, MaxAttempts: 1000})
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	defer func() { cancel(); <-done }()
	b.startConsumers(t, 2)

	// Events flow: five every 50 ms, for about three seconds.
	var (
		mu  sync.Mutex
		ids []uuid.UUID
	)
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for range 60 {
			batch := b.write(t, 5)
			mu.Lock()
			ids = append(ids, batch...)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)
	leader, err := b.nats.StreamLeader(ctx)
	if err != nil || leader == "" {
		t.Fatalf("stream leader: %q %v", leader, err)
	}
	cluster.kill(cluster.node(leader))
	killed := time.Now()
	<-writing

	b.waitApplied(t, ids, 60*time.Second)
	b.assertOnce(t, ids)
	newLeader, err := b.nats.StreamLeader(ctx)
	if err != nil || newLeader == leader {
		t.Fatalf("after killing %s the leader is %q (%v)", leader, newLeader, err)
	}
	t.Logf("%d events; leader %s killed while they flowed, %s leads now; all applied once by each consumer %s after the kill",
		len(ids), leader, newLeader, time.Since(killed).Round(100*time.Millisecond))
}
