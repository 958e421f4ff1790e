package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Node tests of this package (the graphql-ws reference client, the client
// library contract in node/, the browser test in browser/) need Node 20+ and
// npm; each package's dependencies come from its committed package-lock.json.
// Without node or npm those tests fail: a skipped test proves nothing in CI.

// requireNode returns the path of node, failing the test unless it is v20+.
func requireNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node (v20+) is required")
	version, err := exec.Command(node, "-p", "process.versions.node.split('.')[0]").Output()
	require.NoError(t, err)
	major, _ := strconv.Atoi(strings.TrimSpace(string(version)))
	require.GreaterOrEqual(t, major, 20, "node 20 or later is required")
	return node
}

var npmOnce sync.Mutex

// installNodeDeps runs `npm ci` in dir unless node_modules already holds
// exactly what package-lock.json locks (a stamp of the lockfile's hash,
// written after a successful install).
func installNodeDeps(t *testing.T, dir string) {
	t.Helper()
	npmOnce.Lock()
	defer npmOnce.Unlock()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	require.NoError(t, err)
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".dropline-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return
	}
	npm, err := exec.LookPath("npm")
	require.NoError(t, err, "npm is required to install the locked dependencies of %s", dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci in %s:\n%s", dir, out)
	require.NoError(t, os.WriteFile(stamp, []byte(want), 0o644))
}
