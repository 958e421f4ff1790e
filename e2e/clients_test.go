package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

	srv := startBinary(t, map[string]string{
		"DROPLINE_DEV":          "1",
		"DROPLINE_CORS_ORIGINS": clientOrigin,
	})
	s := &system{URL: srv.URL, Issuer: devIssuer(t), Pool: srv.Pool}
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
