package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PrivatePostgres is a PostgreSQL cluster of a test's own, on a free
// loopback port, for tests that stop the server (StopImmediate) without
// disturbing every other test's. It is initialised in a temporary
// directory, run as the postgres user when the test runs as root (initdb
// refuses root), and removed when the test ends.
type PrivatePostgres struct {
	Port     int
	dir      string
	bin      string
	settings []string
	t        testing.TB
}

// StartPrivatePostgres initialises and starts a private cluster; settings
// are extra server settings ("name=value"). It skips the test when
// PostgreSQL's server binaries are not installed.
func StartPrivatePostgres(t testing.TB, settings ...string) *PrivatePostgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	sort.Strings(bins)
	bin := ""
	if len(bins) > 0 {
		bin = filepath.Dir(bins[len(bins)-1])
	} else if p, err := exec.LookPath("pg_ctl"); err == nil {
		bin = filepath.Dir(p)
	}
	if bin == "" {
		t.Skip("PostgreSQL's server binaries (pg_ctl, initdb) are not installed")
	}
	dir, err := os.MkdirTemp("", "dropline-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	port, err := freePort(nil)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p := &PrivatePostgres{Port: port, dir: dir, bin: bin, settings: settings, t: t}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root with no postgres user to run PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	p.run("initdb", "-D", p.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(p.data(), "postmaster.pid")); err == nil {
			_, _ = p.output("pg_ctl", "stop", "-D", p.data(), "-m", "immediate", "-w")
		}
	})
	p.Start()
	return p
}

func (p *PrivatePostgres) data() string { return filepath.Join(p.dir, "data") }

// URL is a connection URL for the cluster's postgres database.
func (p *PrivatePostgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// Start starts the cluster (again) and waits until it accepts connections,
// after crash recovery if it was stopped immediately.
func (p *PrivatePostgres) Start() {
	p.t.Helper()
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s", p.Port, p.dir)
	for _, s := range p.settings {
		opts += " -c " + s
	}
	p.run("pg_ctl", "start", "-D", p.data(), "-w", "-t", "60", "-l", filepath.Join(p.dir, "log"), "-o", opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, p.URL())
		if err == nil {
			_ = c.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			p.t.Fatalf("testenv: the private PostgreSQL does not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StopImmediate stops the cluster as a crash would (pg_ctl stop -m
// immediate): no checkpoint, no flush of the WAL still in its buffers;
// the next Start recovers from what reached the WAL files.
func (p *PrivatePostgres) StopImmediate() {
	p.t.Helper()
	p.run("pg_ctl", "stop", "-D", p.data(), "-m", "immediate", "-w")
}

func (p *PrivatePostgres) run(name string, args ...string) {
	p.t.Helper()
	if out, err := p.output(name, args...); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "log"))
		p.t.Fatalf("testenv: %s %v: %v\n%s\n%s", name, args, err, out, log)
	}
}

func (p *PrivatePostgres) output(name string, args ...string) ([]byte, error) {
	path := filepath.Join(p.bin, name)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...) //nolint:gosec // a test helper running PostgreSQL's own tools
	} else {
		cmd = exec.Command(path, args...) //nolint:gosec // a test helper running PostgreSQL's own tools
	}
	return cmd.CombinedOutput()
}
