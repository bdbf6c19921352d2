package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// BouncerPath is where Debian's pgbouncer package installs the binary.
const BouncerPath = "/usr/sbin/pgbouncer"

// Bouncer is a PgBouncer in transaction mode in front of a cluster: many
// client connections share PoolSize server connections, a server connection
// being a client's only for the length of one transaction. Session state —
// an advisory lock held across transactions, LISTEN, named prepared
// statements (PgBouncer 1.18 does not carry them over) — does not survive
// that; docs/scaling.md says what goes around it.
type Bouncer struct {
	dir  string
	port int
	proc *exec.Cmd
	done chan struct{}
}

// StartBouncer starts pgbouncer in transaction mode in front of c, with at
// most poolSize server connections per database.
func StartBouncer(c *Cluster, poolSize int) (*Bouncer, error) {
	if _, err := os.Stat(BouncerPath); err != nil {
		return nil, fmt.Errorf("pgcluster: %s not found (apt-get install pgbouncer): %w", BouncerPath, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	b := &Bouncer{dir: filepath.Join(c.dir, "pgbouncer"), port: port, done: make(chan struct{})}
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_reset_query =
logfile = %s
`, c.port, port, filepath.Join(b.dir, "users.txt"), poolSize, filepath.Join(b.dir, "pgbouncer.log"))
	for name, data := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := c.writeFile(filepath.Join(b.dir, name), []byte(data)); err != nil {
			return nil, err
		}
	}
	if c.cred != nil {
		if err := os.Chown(b.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	// pgbouncer refuses root, like postgres: it runs as the server's user,
	// and dies with this process.
	b.proc = exec.Command(BouncerPath, filepath.Join(b.dir, "pgbouncer.ini"))
	b.proc.Dir = b.dir
	b.proc.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	if err := b.proc.Start(); err != nil {
		return nil, fmt.Errorf("pgcluster: start pgbouncer: %w", err)
	}
	go func() { b.proc.Wait(); close(b.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, b.URLFor("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT 1`).Scan(new(int))
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return b, nil
		}
		select {
		case <-b.done:
			log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
			return nil, fmt.Errorf("pgcluster: pgbouncer exited: %s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, fmt.Errorf("pgcluster: pgbouncer not answering: %w", err)
		}
	}
}

// URLFor is a URL for database name through the bouncer, with the one pgx
// setting transaction pooling needs: default_query_exec_mode=cache_describe.
// pgx's default prepares each statement by name on its server connection
// and caches the name; through PgBouncer 1.18 the next transaction may run
// on another server connection, where that name is unknown or another
// client's. cache_describe uses the unnamed statement (parse, bind and
// execute in one round trip) and caches only the parameter and result
// types on the client. "exec" (no describe at all) is not enough for
// idemlab: it infers the types from Go values, and cannot send a [16]byte
// as a uuid or []byte as json.
func (b *Bouncer) URLFor(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=cache_describe", b.port, name)
}

// Close stops the bouncer.
func (b *Bouncer) Close() error {
	if b.proc == nil || b.proc.Process == nil {
		return nil
	}
	select {
	case <-b.done:
		return nil
	default:
	}
	b.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		b.proc.Process.Kill()
		<-b.done
	}
	return nil
}
