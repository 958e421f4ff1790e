package httpbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/internal/loopback"
	"github.com/dropline/dropline/internal/machine"
)

// process is a child this run started and must stop.
type process struct {
	name string
	cmd  *exec.Cmd
}

func (p *process) stop(grace time.Duration) {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
}

// cpuTime is the user plus system CPU time the process has used so far, or
// 0 when it cannot be read.
func (p *process) cpuTime() time.Duration {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return machine.PidCPU(p.cmd.Process.Pid)
}

// backends is the CPU time used so far by each PostgreSQL backend connected
// to dbURL's database, by process id (machine.CPUByPid): the server's
// write-behind and reads.
// The loopback server's backends are processes of this machine. It is empty
// when they cannot be read.
func backends(ctx context.Context, dbURL string) map[int]time.Duration {
	got := map[int]time.Duration{}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return got
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return got
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return got
	}
	return machine.CPUByPid(pids)
}

// startRedis starts a private redis-server without persistence.
func startRedis(ctx context.Context, dir string) (*process, string, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("redis-server is not installed (apt-get install redis-server): %w", err)
	}
	port, err := loopback.FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", //nolint:gosec // our own arguments
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no")
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting redis-server: %w", err)
	}
	p := &process{name: "redis-server", cmd: cmd}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return p, addr, nil
		}
		if time.Now().After(deadline) {
			p.stop(time.Second)
			return nil, "", fmt.Errorf("redis-server on %s did not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createDatabase creates an empty database next to the one adminURL names
// and returns its URL and a function that drops it.
func createDatabase(ctx context.Context, adminURL string) (string, func(), error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	if !loopbackHost(u.Hostname()) {
		return "", nil, fmt.Errorf("database host %q is not a loopback address", u.Hostname())
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "dropline_bench_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	drop := func() {
		// The drop must happen even when ctx was cancelled (Ctrl-C).
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(dctx, adminURL)
		if err != nil {
			return
		}
		defer c.Close(dctx)
		_, _ = c.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// dropline runs the binary with env added to a minimal environment.
func dropline(ctx context.Context, bin string, env []string, logFile *os.File, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...) //nolint:gosec // the binary the Makefile just built
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	return cmd
}

// startServer migrates the database and starts `dropline serve` on addr,
// waiting until /readyz answers 200.
func startServer(ctx context.Context, bin string, env []string, logFile *os.File, base string) (*process, error) {
	if err := dropline(ctx, bin, env, logFile, "migrate").Run(); err != nil {
		return nil, fmt.Errorf("dropline migrate: %w (log: %s)", err, logFile.Name())
	}
	// The server outlives ctx's cancellation: stop() ends it with SIGINT, so
	// it shuts down gracefully rather than being killed by exec.
	cmd := dropline(context.WithoutCancel(ctx), bin, env, logFile, "serve")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("dropline serve: %w", err)
	}
	p := &process{name: "dropline", cmd: cmd}
	if err := waitReady(ctx, base, 30*time.Second); err != nil {
		p.stop(5 * time.Second)
		return nil, fmt.Errorf("dropline serve: %w (log: %s)", err, logFile.Name())
	}
	return p, nil
}

// waitReady waits until base/readyz answers 200.
func waitReady(ctx context.Context, base string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, base+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready at %s within %s: %w", base, limit, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
}
