package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/loopback"
)

// DefaultRedisURL is where tests look for Redis when REDIS_URL is unset.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// RedisEnv is one test's slice of a Redis server: a client and a key prefix
// nobody else uses.
type RedisEnv struct {
	Client redis.UniversalClient
	Prefix string
	// Cluster is true when Client talks to a Redis Cluster.
	Cluster bool
}

// Redis returns a client on the shared Redis server and a key prefix unique to
// this test. Keys under the prefix are deleted when the test ends; nothing else
// on the server is touched.
func Redis(t testing.TB) RedisEnv {
	t.Helper()
	raw := os.Getenv("REDIS_URL")
	if raw == "" {
		raw = DefaultRedisURL
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("testenv: REDIS_URL: %v", err)
	}
	opts.PoolSize = 64
	client := redis.NewClient(opts)
	env := RedisEnv{Client: client, Prefix: "t" + randomSuffix() + ":"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: Redis is not reachable at %s (run `make services`): %v", raw, err)
	}
	t.Cleanup(func() {
		deletePrefix(client, env.Prefix)
		_ = client.Close()
	})
	return env
}

func deletePrefix(client redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 500 {
				c.Unlink(ctx, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			c.Unlink(ctx, batch...)
		}
		return iter.Err()
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			// Keys in a cluster must be deleted one slot at a time.
			iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				node.Unlink(ctx, iter.Val())
			}
			return iter.Err()
		})
	case *redis.Client:
		_ = del(ctx, c)
	}
}

// Server is a redis-server process owned by a test: it may be killed,
// restarted or flushed without disturbing anyone else.
type Server struct {
	Addr string
	Port int
	dir  string
	args []string
	proc *process
}

// StartServer starts a private redis-server on a free loopback port. It is
// stopped when the test ends.
func StartServer(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	s, err := startServer(t.TempDir(), extraArgs...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func startServer(dir string, extraArgs ...string) (*Server, error) {
	var s *Server
	err := onFreePort(extraArgs, func(port int) error {
		s = &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, dir: dir}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
		}, extraArgs...)
		return s.Start()
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Start (re)starts the process with its original arguments and waits until it
// answers PING.
func (s *Server) Start() error {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server is not installed (run `make services`): %w", err)
	}
	s.Stop() // a running process is replaced, not left behind
	if s.proc, err = startProcess(path, s.args...); err != nil {
		return err
	}
	if err := s.proc.waitPing(s.Addr, filepath.Join(s.dir, "redis.log"), 10*time.Second); err != nil {
		s.Stop()
		return err
	}
	return nil
}

// Stop kills the process (SIGKILL: it keeps nothing on disk anyway).
func (s *Server) Stop() {
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// freePort finds a loopback port that is free, and whose cluster bus port
// (port+10000) is free too when the server will run in cluster mode.
func freePort(args []string) (int, error) {
	if strings.Contains(strings.Join(args, " "), "--cluster-enabled yes") {
		return loopback.FreePort(10000)
	}
	return loopback.FreePort()
}

// Cluster is a three-master Redis Cluster made of test-owned processes,
// with a replica per master when it was started with them.
type Cluster struct {
	Servers []*Server
	Addrs   []string
}

var (
	clusterOnce sync.Once
	shared      *Cluster
	clusterErr  error
)

// StartCluster starts three redis-server processes in cluster mode on free
// loopback ports and joins them with `redis-cli --cluster create`.
func StartCluster(dir string) (*Cluster, error) { return startCluster(dir, 0) }

// StartReplicatedCluster starts a three-master Redis Cluster with one
// replica per master (six processes), for failover tests: SIGKILL a master
// (its Server's Stop) and the other masters elect its replica in its place
// a few seconds later (the node timeout is 2 s). It waits until every
// replica is in sync; everything stops when the test ends.
func StartReplicatedCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := startCluster(t.TempDir(), 1)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

func startCluster(dir string, replicas int) (*Cluster, error) {
	c := &Cluster{}
	for i := 0; i < 3*(1+replicas); i++ {
		nodeDir := filepath.Join(dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(nodeDir, 0o750); err != nil {
			return nil, err
		}
		s, err := startServer(nodeDir, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(nodeDir, "nodes.conf"), "--cluster-node-timeout", "2000")
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil { //nolint:gosec // our own arguments
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	client := c.client()
	defer client.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, addr := range c.Addrs {
			n := redis.NewClient(&redis.Options{Addr: addr})
			info, err := n.ClusterInfo(context.Background()).Result()
			repl, rerr := n.Info(context.Background(), "replication").Result()
			_ = n.Close()
			if err != nil || rerr != nil || !strings.Contains(info, "cluster_state:ok") ||
				(strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up")) {
				ok = false
			}
		}
		if ok && client.Ping(context.Background()).Err() == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("redis cluster on %v did not reach cluster_state:ok with its replicas in sync", c.Addrs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Client is a cluster client of c, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := c.client()
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Server returns the process listening on addr (host:port), or nil.
func (c *Cluster) Server(addr string) *Server {
	for _, s := range c.Servers {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// ReplicaOf returns the process replicating master, as the replicas' INFO
// says now.
func (c *Cluster) ReplicaOf(ctx context.Context, master *Server) (*Server, error) {
	for _, s := range c.Servers {
		if s == master || s.proc == nil {
			continue
		}
		n := redis.NewClient(&redis.Options{Addr: s.Addr})
		info, err := n.Info(ctx, "replication").Result()
		_ = n.Close()
		if err != nil {
			return nil, fmt.Errorf("INFO replication of %s: %w", s.Addr, err)
		}
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+strconv.Itoa(master.Port)+"\r") {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no replica of %s", master.Addr)
}

// client is a cluster client of c, with the slot map read again every second
// (inventory.ClusterStateReloadInterval, which the engine requires; what
// dropline serve's client does).
func (c *Cluster) client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, PoolSize: 64, ClusterStateReloadInterval: time.Second})
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, s := range c.Servers {
		s.Stop()
	}
}

// RedisCluster returns a client on the binary's shared test cluster (started
// on first use, stopped by Main) and a key prefix unique to this test.
func RedisCluster(t testing.TB) RedisEnv {
	t.Helper()
	clusterOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dropline-cluster-")
		if err != nil {
			clusterErr = err
			return
		}
		shared, clusterErr = StartCluster(dir)
	})
	if clusterErr != nil {
		t.Fatalf("testenv: starting Redis Cluster: %v", clusterErr)
	}
	client := shared.client()
	env := RedisEnv{Client: client, Prefix: "t" + randomSuffix() + ":", Cluster: true}
	t.Cleanup(func() {
		deletePrefix(client, env.Prefix)
		_ = client.Close()
	})
	return env
}

// Backends lists the Redis topologies every engine test runs against.
var Backends = []string{"single", "cluster"}

// RedisBackend returns RedisEnv for a name from Backends.
func RedisBackend(t testing.TB, name string) RedisEnv {
	t.Helper()
	if name == "cluster" {
		return RedisCluster(t)
	}
	return Redis(t)
}

// Main runs a package's tests and then stops what testenv started for the
// whole binary (the shared cluster, the template database). Use it from
// TestMain: `func TestMain(m *testing.M) { testenv.Main(m) }`.
func Main(m *testing.M) {
	os.Exit(run(m))
}

// MainCheckingLeaks is Main, and then fails the binary when any goroutine
// outlived the tests (go.uber.org/goleak). Checking once per package, after
// every test and cleanup, instead of once per test lets the package's tests
// run in parallel: a per-test check would see the goroutines of the tests
// running beside it.
func MainCheckingLeaks(m *testing.M) {
	code := run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	DropTemplates()
	return code
}
