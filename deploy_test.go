// Package idemlab_test checks the deployment files at the repository root:
// docker-compose.yml is loaded the way Docker Compose loads it, and the
// Dockerfile's build command is run as written. No Docker engine is needed.
package idemlab_test

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/idemlab/idemlab/internal/testenv"
)

// loadCompose loads docker-compose.yml with compose-go, the library behind
// `docker compose`, so interpolation, YAML anchors and validation match.
// The OS environment is left out so ${VAR:-default} always takes the default.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions(
		[]string{"docker-compose.yml"},
		cli.WithWorkingDirectory("."),
		cli.WithName("idemlab"),
	)
	if err != nil {
		t.Fatalf("compose options: %v", err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	return project
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("service %q: %v", name, err)
	}
	return s
}

// env returns a service's environment variable, failing if it is unset.
func env(t *testing.T, s types.ServiceConfig, key string) string {
	t.Helper()
	v, ok := s.Environment[key]
	if !ok || v == nil {
		t.Fatalf("service %q: environment %s is not set", s.Name, key)
	}
	return *v
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"db", "db-standby", "app", "app2", "app3", "provider", "payments", "proxy", "nats", "nats2", "nats3", "redis", "kafka", "tasks"} {
		service(t, p, name)
	}
}

func TestComposeDatabaseHealthcheck(t *testing.T) {
	db := service(t, loadCompose(t), "db")

	if !strings.HasPrefix(db.Image, "postgres:15") {
		t.Errorf("db image = %q, want postgres:15", db.Image)
	}
	if db.HealthCheck == nil || db.HealthCheck.Disable {
		t.Fatal("db has no healthcheck")
	}
	test := db.HealthCheck.Test
	if !slices.Contains(test, "pg_isready") {
		t.Errorf("db healthcheck %q does not run pg_isready", test)
	}
	// pg_isready must probe TCP on 127.0.0.1: the socket answers during initdb.
	if i := slices.Index(test, "-h"); i < 0 || i+1 >= len(test) || test[i+1] != "127.0.0.1" {
		t.Errorf("db healthcheck %q lacks -h 127.0.0.1", test)
	}

	published := false
	for _, port := range db.Ports {
		if port.Target == 5432 && port.Published == "5432" && port.HostIP == "127.0.0.1" {
			published = true
		}
	}
	if !published {
		t.Errorf("db ports = %+v, want 127.0.0.1:5432:5432 (make test uses it)", db.Ports)
	}
}

func TestComposeApp(t *testing.T) {
	p := loadCompose(t)
	app := service(t, p, "app")

	if dep, ok := app.DependsOn["db"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("app depends_on db = %+v, want condition %s", dep, types.ServiceConditionHealthy)
	}
	for _, fake := range []string{"provider", "payments"} {
		if _, ok := app.DependsOn[fake]; !ok {
			t.Errorf("app does not depend on %s", fake)
		}
	}

	// The replicas are reachable one by one on loopback only; the proxy
	// publishes 8080 (TestComposeReplicasBehindOneProxy).
	for _, port := range app.Ports {
		if port.HostIP != "127.0.0.1" {
			t.Errorf("app publishes %+v beyond loopback; the proxy is the way in", port)
		}
	}

	dbURL, err := url.Parse(env(t, app, "DATABASE_URL"))
	if err != nil {
		t.Fatalf("app DATABASE_URL: %v", err)
	}
	if !strings.HasPrefix(dbURL.Host, "db:") {
		t.Errorf("app DATABASE_URL hosts = %q, want db first", dbURL.Host)
	}

	// PROVIDER_URL and PAYMENTS_URL must name their services on the ports
	// they listen on, and the app must send the control token they require.
	for _, fake := range []struct{ service, env string }{{"provider", "PROVIDER"}, {"payments", "PAYMENTS"}} {
		svc := service(t, p, fake.service)
		u, err := url.Parse(env(t, app, fake.env+"_URL"))
		if err != nil {
			t.Fatalf("app %s_URL: %v", fake.env, err)
		}
		if u.Hostname() != fake.service {
			t.Errorf("app %s_URL host = %q, want %s", fake.env, u.Hostname(), fake.service)
		}
		addr := env(t, svc, fake.env+"_ADDR")
		if _, port, _ := strings.Cut(addr, ":"); port == "" || port != u.Port() {
			t.Errorf("app %s_URL port = %q, %s listens on %s_ADDR %q", fake.env, u.Port(), fake.service, fake.env, addr)
		}
		if a, f := env(t, app, "FAKE_CONTROL_TOKEN"), env(t, svc, "FAKE_CONTROL_TOKEN"); a == "" || a != f {
			t.Errorf("FAKE_CONTROL_TOKEN: app %q, %s %q; want one non-empty token", a, fake.service, f)
		}
	}

	if env(t, app, "SESSION_SECRET") == "" {
		t.Error("app SESSION_SECRET is empty")
	}
	if got := env(t, app, "DEMO_MODE"); got != "true" {
		t.Errorf("app DEMO_MODE = %q, want true", got)
	}
	// The app trusts exactly the proxy's forwarding headers.
	proxy, ok := p.Services["proxy"]
	if !ok {
		t.Fatal("no proxy service")
	}
	var proxyIP string
	for _, n := range proxy.Networks {
		if n != nil {
			proxyIP = n.Ipv4Address
		}
	}
	if proxyIP == "" || env(t, app, "TRUSTED_PROXIES") != proxyIP {
		t.Errorf("app TRUSTED_PROXIES = %q, the proxy's fixed address %q", env(t, app, "TRUSTED_PROXIES"), proxyIP)
	}
	if env(t, app, "INSTANCE_ID") == "" {
		t.Error("app INSTANCE_ID is empty")
	}
}

// Two replicas share the database, the provider and the session secret,
// differ by INSTANCE_ID, and sit behind one proxy on the published port
// 8080, so recovery by another instance than the one that crashed is
// visible.
func TestComposeReplicasBehindOneProxy(t *testing.T) {
	p := loadCompose(t)
	app := service(t, p, "app")
	for i, name := range []string{"app2", "app3"} {
		other := service(t, p, name)
		for _, key := range []string{"DATABASE_URL", "PROVIDER_URL", "PAYMENTS_URL", "FAKE_CONTROL_TOKEN", "SESSION_SECRET", "RECOVERY_CLAIM", "NATS_URL", "EVENTS_REPLICAS"} {
			if a, b := env(t, app, key), env(t, other, key); a != b {
				t.Errorf("%s differs between app and %s: %q vs %q", key, name, a, b)
			}
		}
		if id := env(t, other, "INSTANCE_ID"); id != fmt.Sprintf("app-%d", i+2) {
			t.Errorf("%s INSTANCE_ID = %q", name, id)
		}
		if !slices.Equal(other.Command, types.ShellCommand{"serve"}) || other.Build == nil {
			t.Errorf("%s is not built and run like app: command %q", name, other.Command)
		}
		if _, ok := other.DependsOn["provider"]; !ok {
			t.Errorf("%s does not depend on provider", name)
		}
	}
	if id := env(t, app, "INSTANCE_ID"); id != "app-1" {
		t.Errorf("app INSTANCE_ID = %q, want app-1", id)
	}

	proxy := service(t, p, "proxy")
	publishes8080 := false
	for _, port := range proxy.Ports {
		publishes8080 = publishes8080 || (port.Target == 8080 && port.Published == "8080")
	}
	if !publishes8080 {
		t.Errorf("proxy ports = %+v, want 8080:8080", proxy.Ports)
	}
	for _, dep := range []string{"app", "app2", "app3"} {
		if _, ok := proxy.DependsOn[dep]; !ok {
			t.Errorf("proxy does not depend on %s", dep)
		}
	}
	if len(proxy.Configs) != 1 || proxy.Configs[0].Target != "/etc/caddy/Caddyfile" {
		t.Fatalf("proxy configs = %+v, want the Caddyfile", proxy.Configs)
	}
	cfg, ok := p.Configs[proxy.Configs[0].Source]
	if !ok {
		t.Fatalf("config %q is not defined", proxy.Configs[0].Source)
	}
	for _, upstream := range []string{"app:8080", "app2:8080", "app3:8080"} {
		if !strings.Contains(cfg.Content, upstream) {
			t.Errorf("Caddyfile does not proxy to %s:\n%s", upstream, cfg.Content)
		}
	}
}

// Each fake runs alone (`web provider`, `web payments`) once the database
// is healthy.
func TestComposeFakes(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"provider", "payments"} {
		fake := service(t, p, name)
		if !slices.Equal(fake.Command, types.ShellCommand{name}) {
			t.Errorf("%s command = %q, want [%s]", name, fake.Command, name)
		}
		if dep, ok := fake.DependsOn["db"]; !ok || dep.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s depends_on db = %+v, want condition %s", name, dep, types.ServiceConditionHealthy)
		}
		dbURL, err := url.Parse(env(t, fake, "DATABASE_URL"))
		if err != nil {
			t.Fatalf("%s DATABASE_URL: %v", name, err)
		}
		if !strings.HasPrefix(dbURL.Host, "db:") {
			t.Errorf("%s DATABASE_URL hosts = %q, want db first", name, dbURL.Host)
		}
		for _, port := range fake.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %+v beyond loopback", name, port)
			}
		}
	}
}

// JetStream runs as a cluster of three services, each with a durable store
// and routes to the other two; every app replica lists all three, keeps
// the stream on all three, and waits for them.
func TestComposeNATS(t *testing.T) {
	p := loadCompose(t)
	nodes := []string{"nats", "nats2", "nats3"}
	for _, name := range nodes {
		nats := service(t, p, name)
		if !strings.HasPrefix(nats.Image, "nats:") {
			t.Errorf("%s image = %q", name, nats.Image)
		}
		if !slices.Contains(nats.Command, "-js") {
			t.Errorf("%s command %q lacks -js (JetStream)", name, nats.Command)
		}
		if i := slices.Index(nats.Command, "-sd"); i < 0 || i+1 >= len(nats.Command) {
			t.Errorf("%s command %q has no store directory (-sd)", name, nats.Command)
		} else if !slices.ContainsFunc(nats.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == nats.Command[i+1] }) {
			t.Errorf("%s stores in %s, which is not a volume: JetStream would forget its stream on restart", name, nats.Command[i+1])
		}
		i := slices.Index(nats.Command, "--routes")
		if i < 0 || i+1 >= len(nats.Command) || !slices.Contains(nats.Command, "--cluster_name") {
			t.Fatalf("%s command %q: no cluster (--cluster_name, --routes)", name, nats.Command)
		}
		for _, other := range nodes {
			if routed := strings.Contains(nats.Command[i+1], "nats://"+other+":6222"); routed == (other == name) {
				t.Errorf("%s routes %q: want a route to every other node, none to itself", name, nats.Command[i+1])
			}
		}
	}
	for _, name := range []string{"app", "app2", "app3"} {
		app := service(t, p, name)
		for _, node := range nodes {
			if !strings.Contains(env(t, app, "NATS_URL"), "nats://"+node+":4222") {
				t.Errorf("%s NATS_URL = %q lacks %s", name, env(t, app, "NATS_URL"), node)
			}
			if _, ok := app.DependsOn[node]; !ok {
				t.Errorf("%s does not depend on %s", name, node)
			}
		}
		if r := env(t, app, "EVENTS_REPLICAS"); r != "3" {
			t.Errorf("%s EVENTS_REPLICAS = %q, want 3", name, r)
		}
		if tr := env(t, app, "EVENTS_TRANSPORT"); tr != "nats" && tr != "river" && tr != "kafka" && tr != "tasks" {
			t.Errorf("%s EVENTS_TRANSPORT = %q", name, tr)
		}
	}
}

// The database is a primary and a synchronous streaming standby; every
// replica and fake lists both, primary first, and keeps only the one that
// takes writes.
func TestComposeDatabaseFailover(t *testing.T) {
	p := loadCompose(t)
	db, standby := service(t, p, "db"), service(t, p, "db-standby")
	if !slices.Contains(db.Command, "synchronous_standby_names=standby") || !slices.Contains(db.Command, "synchronous_commit=on") {
		t.Errorf("db command %q: want synchronous_standby_names=standby and synchronous_commit=on", db.Command)
	}
	script := strings.Join(standby.Command, " ")
	for _, want := range []string{"pg_basebackup -h db", "application_name=standby", "standby.signal", "synchronous_standby_names="} {
		if !strings.Contains(script, want) {
			t.Errorf("db-standby's start lacks %q:\n%s", want, script)
		}
	}
	if dep, ok := standby.DependsOn["db"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("db-standby depends_on db = %+v, want healthy", dep)
	}
	for _, name := range []string{"app", "app2", "app3", "provider", "payments", "tasks"} {
		u := env(t, service(t, p, name), "DATABASE_URL")
		if !strings.Contains(u, "@db:5432,db-standby:5432/") || !strings.Contains(u, "target_session_attrs=read-write") {
			t.Errorf("%s DATABASE_URL = %q: want both servers, primary first, target_session_attrs=read-write", name, u)
		}
	}
}

// Redis runs as its own service for the Redis lab, without persistence, and
// every app replica reaches it by name.
func TestComposeRedis(t *testing.T) {
	p := loadCompose(t)
	r := service(t, p, "redis")
	if !strings.HasPrefix(r.Image, "redis:") {
		t.Errorf("redis image = %q", r.Image)
	}
	cmd := strings.Join(r.Command, " ")
	if !strings.Contains(cmd, "--appendonly no") || !slices.Contains(r.Command, "--save") {
		t.Errorf("redis command %q: the lab's Redis keeps nothing on disk (--save '' --appendonly no)", cmd)
	}
	for _, name := range []string{"app", "app2"} {
		app := service(t, p, name)
		u, err := url.Parse(env(t, app, "REDIS_URL"))
		if err != nil || u.Scheme != "redis" || u.Hostname() != "redis" || u.Port() != "6379" {
			t.Errorf("%s REDIS_URL = %q, want redis://redis:6379/0", name, env(t, app, "REDIS_URL"))
		}
		if _, ok := app.DependsOn["redis"]; !ok {
			t.Errorf("%s does not depend on redis", name)
		}
	}
}

func TestComposeBuildsFromDockerfile(t *testing.T) {
	p := loadCompose(t)
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"app", "provider", "payments"} {
		s := service(t, p, name)
		if s.Build == nil {
			t.Errorf("service %q has no build section", name)
			continue
		}
		// The loader resolves the context to an absolute path.
		if s.Build.Context != root {
			t.Errorf("service %q build context = %q, want %q", name, s.Build.Context, root)
		}
		if s.Build.Dockerfile != "Dockerfile" {
			t.Errorf("service %q dockerfile = %q, want Dockerfile", name, s.Build.Dockerfile)
		}
	}
}

// dockerfileBuildCommand returns the shell command of the build stage's
// `RUN … go build …` instruction, with line continuations joined and RUN
// flags (such as --mount) dropped.
func dockerfileBuildCommand(t *testing.T) string {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var instructions []string
	var current strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if current.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			current.WriteString(cont + " ")
			continue
		}
		current.WriteString(line)
		instructions = append(instructions, current.String())
		current.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	var commands []string
	stage := 0
	for _, ins := range instructions {
		keyword, rest, _ := strings.Cut(ins, " ")
		switch strings.ToUpper(keyword) {
		case "FROM":
			stage++
		case "RUN":
			if stage != 1 {
				continue
			}
			fields := strings.Fields(rest)
			for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
				fields = fields[1:]
			}
			cmd := strings.Join(fields, " ")
			if strings.Contains(cmd, "go build") {
				commands = append(commands, cmd)
			}
		}
	}
	if len(commands) != 1 {
		t.Fatalf("Dockerfile build stage: want one RUN with go build, found %q", commands)
	}
	return commands[0]
}

func TestDockerfileBuildCommand(t *testing.T) {
	cmd := dockerfileBuildCommand(t)
	want := `CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/web ./cmd/web`
	if cmd != want {
		t.Errorf("Dockerfile build command:\n got %s\nwant %s", cmd, want)
	}
}

// TestDockerfileBuild runs the Dockerfile's build command as written, only
// writing the binary into a temporary directory instead of /out.
func TestDockerfileBuild(t *testing.T) {
	testenv.SkipIfShort(t, "builds the app with go build")
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("sh not found")
	}

	cmd := dockerfileBuildCommand(t)
	if !strings.Contains(cmd, " -o /out/web ") {
		t.Fatalf("build command %q does not write /out/web", cmd)
	}
	out := filepath.Join(t.TempDir(), "web")
	cmd = strings.Replace(cmd, " -o /out/web ", " -o "+out+" ", 1)

	// Docker runs the shell form of RUN with /bin/sh -c. The build context has
	// no .git (.dockerignore), so no VCS stamp there; none here either. The
	// chaos soak and the load tool's test build the same binary
	// (testenv.AppBinary): one build at a time, so the second is a link.
	build := exec.Command("sh", "-c", cmd)
	build.Env = testenv.BuildEnv()
	unlock := testenv.LockBuild(t)
	output, err := build.CombinedOutput()
	unlock()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, output)
	}
	info, err := os.Stat(out)
	if err != nil {
		t.Fatalf("binary not produced: %v", err)
	}
	if info.Size() == 0 || info.Mode()&0o111 == 0 {
		t.Errorf("binary %s: size %d, mode %v", out, info.Size(), info.Mode())
	}
}

// Kafka runs as its own service in KRaft mode (one node, broker and
// controller), its log on a volume, advertised by its service name; every
// app replica reaches it there (not the embedded broker) and waits for it.
func TestComposeKafka(t *testing.T) {
	p := loadCompose(t)
	kafka := service(t, p, "kafka")
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") {
		t.Errorf("kafka image = %q", kafka.Image)
	}
	roles := strings.Split(env(t, kafka, "KAFKA_PROCESS_ROLES"), ",")
	if !slices.Contains(roles, "broker") || !slices.Contains(roles, "controller") {
		t.Errorf("KAFKA_PROCESS_ROLES = %v, want broker and controller (KRaft, one node)", roles)
	}
	if v := env(t, kafka, "KAFKA_CONTROLLER_QUORUM_VOTERS"); !strings.HasPrefix(v, env(t, kafka, "KAFKA_NODE_ID")+"@kafka:") {
		t.Errorf("KAFKA_CONTROLLER_QUORUM_VOTERS = %q, want this node as the one voter", v)
	}
	if v := env(t, kafka, "KAFKA_ADVERTISED_LISTENERS"); !strings.Contains(v, "://kafka:9092") {
		t.Errorf("KAFKA_ADVERTISED_LISTENERS = %q: clients on the network must be told kafka:9092", v)
	}
	if v := env(t, kafka, "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"); v != "1" {
		t.Errorf("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR = %q: one node cannot hold more replicas of the committed offsets", v)
	}
	logs := env(t, kafka, "KAFKA_LOG_DIRS")
	if !slices.ContainsFunc(kafka.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == logs }) {
		t.Errorf("kafka keeps its log in %s, which is not a volume: it would forget topics and offsets on restart", logs)
	}
	for _, name := range []string{"app", "app2"} {
		app := service(t, p, name)
		if b := env(t, app, "KAFKA_BROKERS"); b != "kafka:9092" {
			t.Errorf("%s KAFKA_BROKERS = %q, want kafka:9092 (the real broker, not the embedded one)", name, b)
		}
		if _, ok := app.DependsOn["kafka"]; !ok {
			t.Errorf("%s does not depend on kafka", name)
		}
	}
}

// The task queue runs alone (`web tasks`); every replica creates its tasks
// there, with the same push token and window, and the queue pushes through
// the proxy, so either replica handles a push.
func TestComposeTaskQueue(t *testing.T) {
	p := loadCompose(t)
	tasks := service(t, p, "tasks")
	if len(tasks.Command) != 1 || tasks.Command[0] != "tasks" {
		t.Errorf("tasks command = %v, want [tasks]", tasks.Command)
	}
	addr := env(t, tasks, "TASKS_ADDR")
	window := env(t, tasks, "TASKS_DEDUPE_WINDOW")
	for _, name := range []string{"app", "app2"} {
		app := service(t, p, name)
		if u := env(t, app, "TASKS_URL"); u != "http://tasks"+addr {
			t.Errorf("%s TASKS_URL = %q, want http://tasks%s", name, u, addr)
		}
		if u := env(t, app, "TASKS_PUSH_URL"); u != "http://proxy:8080" {
			t.Errorf("%s TASKS_PUSH_URL = %q, want the proxy", name, u)
		}
		if env(t, app, "TASKS_PUSH_TOKEN") == "" || env(t, app, "TASKS_DEDUPE_WINDOW") != window {
			t.Errorf("%s: a push token and the queue's window (%s) are needed", name, window)
		}
		if _, ok := app.DependsOn["tasks"]; !ok {
			t.Errorf("%s does not depend on tasks", name)
		}
	}
}

// docs/deploy.md names every service of the compose file and every make
// target with a help line (issue 29, finding 13: it listed three of seven
// services and missed targets).
func TestDeployDocNamesEveryServiceAndTarget(t *testing.T) {
	doc, err := os.ReadFile("docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range loadCompose(t).Services {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/deploy.md does not name the compose service %q", name)
		}
	}
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mk), "\n") {
		target, _, ok := strings.Cut(line, ": ## ")
		if !ok || target == "help" {
			continue
		}
		if !strings.Contains(string(doc), "`make "+target+"`") {
			t.Errorf("docs/deploy.md does not name `make %s`", target)
		}
	}
}
