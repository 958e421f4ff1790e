package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/testenv"
)

// The frontend contract, checked with the clients frontends use: the
// GraphQL over HTTP specification's own audit (graphql-http), Apollo
// Client, urql with Graphcache, graphql-sse and relay-runtime, all run by
// `node --test` against the real binary in dev mode (e2e/node/test). Node
// and npm are required: the test fails, not skips, without them.

// clientOrigin is the browser origin the Node tests send; the server lists
// it in DROPLINE_CORS_ORIGINS.
const clientOrigin = "http://app.localhost:3000"

func TestClientContracts(t *testing.T) {
	t.Parallel()
	node := requireNode(t)
	dir, err := filepath.Abs("node")
	require.NoError(t, err)
	installNodeDeps(t, dir)

	s := serveBinary(t)
	for sku, units := range map[string]int{"APOLLO-1": 50, "URQL-1": 50, "RELAY-1": 50, "SSE-1": 50} {
		s.createProduct(t, sku, units, 0)
	}
	tokens := map[string]string{}
	for _, name := range []string{"apollo", "urql", "relay", "sse", "watcher"} {
		tokens[name] = s.token(t, "node-"+name, false)
	}
	tokens["admin"] = s.token(t, "node-admin", true)
	tokensJSON, err := json.Marshal(tokens)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The committed Relay artifacts must match the schema and their sources.
	npm, err := exec.LookPath("npm")
	require.NoError(t, err)
	validate := exec.CommandContext(ctx, npm, "run", "--silent", "relay", "--", "--validate")
	validate.Dir = dir
	out, err := validate.CombinedOutput()
	require.NoError(t, err, "test/relay/__generated__ is stale: run `npm run relay` in e2e/node and commit the result\n%s", out)

	start := time.Now()
	files, err := filepath.Glob(filepath.Join(dir, "test", "*.test.mjs"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"DROPLINE_URL="+s.URL,
		"DROPLINE_TOKENS="+string(tokensJSON),
		"DROPLINE_ORIGIN="+clientOrigin,
		"NO_COLOR=1",
	)
	out, err = cmd.CombinedOutput()
	t.Logf("node --test (%s):\n%s", time.Since(start).Round(time.Millisecond), out)
	require.NoError(t, err, "the Node client tests failed: see their output above")
	require.Contains(t, string(out), "audit: 61 ok, 0 notices, 0 warnings, 0 errors", "every audit of the GraphQL over HTTP specification passes")
}

func requireNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node (v20+) is required for the Node client tests")
	version, err := exec.Command(node, "-p", "process.versions.node.split('.')[0]").Output()
	require.NoError(t, err)
	major, _ := strconv.Atoi(strings.TrimSpace(string(version)))
	require.GreaterOrEqual(t, major, 20, "the Node client tests need node 20 or later")
	return node
}

// buildBinary builds cmd/dropline into the test's temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dropline")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/dropline/dropline/cmd/dropline").CombinedOutput()
	require.NoError(t, err, "building dropline:\n%s", out)
	return bin
}

// serveBinary builds cmd/dropline and runs `dropline serve` in dev mode
// (the built-in secret, introspection on) on a free loopback port, with its
// own database and Redis key prefix, and waits for /readyz. The process is
// stopped with SIGTERM when the test ends.
func serveBinary(t *testing.T) *system {
	t.Helper()
	bin := buildBinary(t)
	redisEnv := testenv.Redis(t)
	dbURL := testenv.NewDatabase(t)
	redisURL := os.Getenv("REDIS_URL")
	if redisURL == "" {
		redisURL = testenv.DefaultRedisURL
	}

	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.TempDir(),
		"DROPLINE_DEV=1",
		"DROPLINE_ADDR=127.0.0.1:0",
		"REDIS_URL=" + redisURL,
		"DATABASE_URL=" + dbURL,
		"DROPLINE_KEY_PREFIX=" + redisEnv.Prefix,
		"DROPLINE_CORS_ORIGINS=" + clientOrigin,
		"DROPLINE_LOG_FORMAT=json",
		"DROPLINE_SHUTDOWN_TIMEOUT=5s",
	}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var logs bytes.Buffer
	var logMu sync.Mutex
	addr := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logMu.Lock()
			logs.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			var line struct {
				Message string `json:"message"`
				Addr    string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && strings.Contains(line.Message, "dropline is serving") && line.Addr != "" {
				select {
				case addr <- line.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	log := func() string { logMu.Lock(); defer logMu.Unlock(); return logs.String() }
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("dropline did not stop within 15 s of SIGINT:\n%s", log())
		}
	})

	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case <-exited:
		t.Fatalf("dropline exited at start:\n%s", log())
	case <-time.After(30 * time.Second):
		t.Fatalf("dropline did not report its address:\n%s", log())
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "dropline never became ready:\n%s", log())

	iss, err := auth.NewIssuer([]byte(config.DevJWTSecret))
	require.NoError(t, err)
	return &system{URL: url, Issuer: iss}
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
	require.NoError(t, err, "npm is required to install the Node client tests' dependencies")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci in %s:\n%s", dir, out)
	require.NoError(t, os.WriteFile(stamp, []byte(want), 0o644))
}
