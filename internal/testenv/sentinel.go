package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of a Replicated set monitor.
const SentinelMaster = "dropline"

// Replicated is a Redis primary with one replica under three sentinels,
// all processes owned by a test, for failover tests: kill the primary and
// the sentinels promote the replica within a few seconds.
type Replicated struct {
	Primary   *Server
	Replica   *Server
	Sentinels []*Sentinel
}

// SentinelAddrs lists the sentinels' host:port addresses.
func (r *Replicated) SentinelAddrs() []string {
	out := make([]string, len(r.Sentinels))
	for i, s := range r.Sentinels {
		out[i] = s.Addr
	}
	return out
}

// URL is the REDIS_URL of the set: redis-sentinel://s1,s2,s3/0?master=dropline.
func (r *Replicated) URL() string {
	u := "redis-sentinel://"
	for i, a := range r.SentinelAddrs() {
		if i > 0 {
			u += ","
		}
		u += a
	}
	return u + "/0?master=" + SentinelMaster
}

// Client is a go-redis failover client of the set, closed when the test ends.
func (r *Replicated) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: r.SentinelAddrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// StartReplicated starts the primary, a replica of it and three sentinels
// (quorum 2, the primary is judged down after downAfter), and waits until
// the replica is in sync and every sentinel knows both. Everything stops
// when the test ends.
func StartReplicated(t testing.TB, downAfter time.Duration) *Replicated {
	t.Helper()
	r, err := startReplicated(t.TempDir(), downAfter)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

func startReplicated(dir string, downAfter time.Duration) (*Replicated, error) {
	r := &Replicated{}
	for _, d := range []string{"primary", "replica"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			return nil, err
		}
	}
	var err error
	if r.Primary, err = startServer(filepath.Join(dir, "primary")); err != nil {
		return nil, err
	}
	if r.Replica, err = startServer(filepath.Join(dir, "replica"), "--replicaof", "127.0.0.1", strconv.Itoa(r.Primary.Port)); err != nil {
		r.Stop()
		return nil, err
	}
	if err := waitInSync(r.Primary.Addr, 1); err != nil {
		r.Stop()
		return nil, err
	}
	for i := range 3 {
		s, err := startSentinel(filepath.Join(dir, fmt.Sprintf("sentinel%d", i)), r.Primary.Port, downAfter)
		if err != nil {
			r.Stop()
			return nil, err
		}
		r.Sentinels = append(r.Sentinels, s)
	}
	for _, s := range r.Sentinels {
		if err := s.waitKnows(1, 2); err != nil {
			r.Stop()
			return nil, err
		}
	}
	return r, nil
}

// Stop kills every process of the set.
func (r *Replicated) Stop() {
	for _, s := range r.Sentinels {
		s.Stop()
	}
	if r.Replica != nil {
		r.Replica.Resume()
		r.Replica.Stop()
	}
	if r.Primary != nil {
		r.Primary.Stop()
	}
}

// waitInSync waits until the primary at addr has n replicas online.
func waitInSync(addr string, n int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := c.Do(ctx, "WAIT", n, 100).Int()
		cancel()
		if err == nil && got >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the replica of %s did not come in sync", addr)
}

// Pause stops the process (SIGSTOP) without killing it: its connections
// stay open and nothing is read from them, as on a stalled host. Resume
// continues it.
func (s *Server) Pause() {
	if s.proc != nil {
		s.proc.signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process.
func (s *Server) Resume() {
	if s.proc != nil {
		s.proc.signal(syscall.SIGCONT)
	}
}

// Sentinel is a redis-sentinel process owned by a test.
type Sentinel struct {
	Addr string
	dir  string
	proc *process
}

func startSentinel(dir string, primaryPort int, downAfter time.Duration) (*Sentinel, error) {
	path, err := exec.LookPath("redis-sentinel")
	if err != nil {
		return nil, fmt.Errorf("redis-sentinel is not installed (`make tools` installs it): %w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var s *Sentinel
	err = onFreePort(nil, func(port int) error {
		// The sentinel rewrites its config as it learns the set; each
		// attempt starts from a fresh one.
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "sentinel.log"), SentinelMaster, primaryPort,
			SentinelMaster, downAfter.Milliseconds(), SentinelMaster, SentinelMaster)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		s = &Sentinel{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		var err error
		if s.proc, err = startProcess(path, conf); err != nil {
			return err
		}
		if err = s.proc.waitPing(s.Addr, s.log(), 10*time.Second); err != nil {
			s.Stop()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sentinel) log() string { return filepath.Join(s.dir, "sentinel.log") }

// waitKnows waits until the sentinel sees the replicas and the other sentinels.
func (s *Sentinel) waitKnows(replicas, otherSentinels int) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if s.proc == nil || !s.proc.alive() {
			return fmt.Errorf("sentinel %s %w: %s", s.Addr, errExited, lastLine(s.log()))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		m, err := c.Master(ctx, SentinelMaster).Result()
		cancel()
		if err == nil {
			nr, _ := strconv.Atoi(m["num-slaves"])
			ns, _ := strconv.Atoi(m["num-other-sentinels"])
			if nr >= replicas && ns >= otherSentinels {
				return nil
			}
			last = fmt.Errorf("sees %d replicas and %d other sentinels", nr, ns)
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("sentinel %s did not learn the set: %w (%s)", s.Addr, last, lastLine(s.log()))
}

// Stop kills the sentinel.
func (s *Sentinel) Stop() {
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}
