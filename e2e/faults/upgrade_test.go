package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// previousRelease is the commit of the release before this one, the one a
// rolling upgrade replaces: TestRollingUpgrade builds it from the
// repository's history and runs it beside this tree's binary. Moved forward
// when a release is cut (docs/operations.md, Upgrades), to the commit of the
// release the new one follows.
const previousRelease = "ee61347364c72e9c7cf98a4009eda3834d4e31e4"

// buildRelease returns the dropline binary of commit, built once from the
// repository's history (git archive into a temporary directory, then go
// build) and kept in the user's cache directory under the commit's hash, so
// later runs start at once. The Go build cache makes even the first build
// mostly a link: most packages of an adjacent release are unchanged.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	require.NoError(t, err)
	dir := filepath.Join(cache, "dropline", "releases", commit)
	bin := filepath.Join(dir, "dropline")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	git := func(args ...string) []byte {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			var stderr []byte
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = ee.Stderr
			}
			t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		return out
	}
	root := strings.TrimSpace(string(git("rev-parse", "--show-toplevel")))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Fatalf("the previous release %s is not in this clone's history (a shallow clone? run `git fetch --unshallow`): %v", commit, err)
	}
	src := t.TempDir()
	began := time.Now()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	extract := exec.Command("tar", "-x", "-C", src)
	var archiveErr, extractErr bytes.Buffer // apart: each process' output is copied by a goroutine of its own
	archive.Stderr, extract.Stderr = &archiveErr, &extractErr
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	extract.Stdin = pipe
	require.NoError(t, extract.Start())
	require.NoError(t, archive.Run(), "git archive %s: %s", commit, archiveErr.String())
	require.NoError(t, extract.Wait(), "extracting %s: %s", commit, extractErr.String())

	require.NoError(t, os.MkdirAll(dir, 0o755))
	tmp := bin + ".tmp" + strconv.Itoa(os.Getpid())
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version="+commit[:12], "-o", tmp, "./cmd/dropline")
	build.Dir = src
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the release %s: %s", commit, out)
	require.NoError(t, os.Rename(tmp, bin))
	t.Logf("built the release %s in %s", commit[:12], time.Since(began).Round(time.Millisecond))
	return bin
}

// run runs one `dropline` command of bin (migrate, ...) with the system's
// environment and returns its output.
func (s *system) run(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = s.environ()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestRollingUpgrade runs a rolling upgrade mid-drop, as docs/operations.md
// (Upgrades) tells an operator to: the previous release (built from the
// repository's history) migrates an empty database and serves the drop;
// this release's migrations run while it serves (they only expand); this
// release starts beside it on the same Redis prefix and database, and both
// answer reserves, commits and cancels; the previous release is stopped
// (SIGTERM, as an orchestrator does) and a second instance of this release
// takes its place. Afterwards the checks of every fault scenario hold (no
// oversell at any sampled instant, every hold committed, cancelled or
// expired, every acknowledged commit sold, the ledger and Redis row by row
// the same story), no outbox entry of either release was set aside as a
// dead letter, and Redis records this release's layout. Then an instance is
// started against a Redis that records a layout of a release that cannot
// run beside this one: it refuses to start and says why.
func TestRollingUpgrade(t *testing.T) {
	prev := buildRelease(t, previousRelease)
	s := newSystemOn(t, testenv.NewUnmigratedDatabase(t))
	out, err := s.run(prev, "migrate")
	require.NoError(t, err, "the previous release migrates: %s", out)
	old := s.startBinary("old", prev)

	// Three quarters of the buyers wait until the new release has started,
	// so both releases serve them however long the start takes: on a loaded
	// machine the old one alone once sold 68 of 80 units before the new one
	// answered, and the new one then had almost no hold to commit.
	buyers := scale(240, 600)
	gate := make(chan struct{})
	d := startDrop(s, dropConfig{SKU: "UPGRADE-1", Total: 160, Buyers: buyers, Concurrency: 16,
		Pace: 40 * time.Millisecond, HoldSeconds: 3, Commit: 0.6, Cancel: 0.2, DoubleCommit: 0.2,
		Gate: gate, GateAt: buyers / 4, Within: 100 * time.Second}) // the wait at the gate counts too
	d.waitProgress(t, 20)

	// Migrate first (expand only: the previous release runs on), then roll.
	out, err = s.run(binary, "migrate")
	require.NoError(t, err, "this release migrates beside the previous one: %s", out)
	s.waitReady(old, 5*time.Second)
	oldBefore := d.servedBy(old, "reserve")
	next := s.start("new")
	close(gate)
	eventually(t, 20*time.Second, "both releases answer reserves and commits", func() (bool, string) {
		counts := []int{d.servedBy(old, "reserve") - oldBefore, d.servedBy(old, "commit"),
			d.servedBy(next, "reserve"), d.servedBy(next, "commit")}
		for _, n := range counts {
			if n < 3 {
				return false, fmt.Sprintf("old reserves since the new one started, old commits, new reserves, new commits: %v", counts)
			}
		}
		return true, ""
	})
	old.signal(syscall.SIGTERM)
	select {
	case <-old.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the previous release did not stop on SIGTERM:\n%s", old.log.String())
	}
	s.start("new-2")
	d.wait(t)
	d.verify(t, verifyOpts{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p := range inventory.Partitions {
		n, err := s.RDB.XLen(ctx, s.Keys.DeadLetters(p)).Result()
		require.NoError(t, err)
		require.Zero(t, n, "partition %d set outbox entries aside", p)
	}
	layout, err := s.RDB.HGetAll(ctx, s.Keys.Layout()).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"layout": strconv.Itoa(inventory.LayoutVersion), "compat": strconv.Itoa(inventory.LayoutCompatible)}, layout)
	d.mu.Lock()
	served := fmt.Sprint(d.served)
	d.mu.Unlock()
	d.figures(t, "rolling-upgrade", 1, "served="+served)

	// A release that cannot run beside the one that wrote Redis refuses to
	// start, and says why.
	newer := inventory.LayoutVersion + 1
	require.NoError(t, s.RDB.HSet(ctx, s.Keys.Layout(), "layout", newer, "compat", newer).Err())
	out, err = s.run(binary, "serve")
	require.Error(t, err, "an instance started beside an incompatible layout: %s", out)
	require.Contains(t, out, "written by a newer Dropline that cannot run beside this one")
	require.Contains(t, out, "Upgrades in docs/operations.md")
}
