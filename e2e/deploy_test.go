package e2e

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// metricName is a series name as the dashboard and the alert rules use it.
var metricName = regexp.MustCompile(`\b((?:dropline|process|go)_[a-z0-9_]+)\b`)

// namesIn returns the metric names an expression file uses.
func namesIn(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
		seen[m[1]] = true
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestDashboardAndAlertsNameRealMetrics: every metric deploy/'s Grafana
// dashboard and Prometheus alert rules query is one the server exports on
// /metrics (a histogram's _bucket, _sum and _count included), once it has
// served a few reserves and its workers have run: a renamed metric fails
// here, not on an operator's empty panel or silent alert.
func TestDashboardAndAlertsNameRealMetrics(t *testing.T) {
	s := start(t)
	s.createProduct(t, "DASH-1", 5, 0)
	alice := s.token(t, "alice", false)
	r := s.reserveOver(t, alice, "DASH-1", 1, 0)
	s.cancelOver(t, alice, r.Token)
	s.reserveOver(t, alice, "DASH-1", 1, 0)
	// The webhook gauges are per endpoint: one endpoint makes them exported.
	var hook struct {
		CreateWebhookEndpoint struct{ UserErrors []userError }
	}
	s.gql(t, http.DefaultClient, s.token(t, "ops", true), `mutation { createWebhookEndpoint(input: {
		url: "http://127.0.0.1:9/hooks", eventTypes: ["restock"]}) { userErrors { code message } } }`, nil, &hook)
	require.Empty(t, hook.CreateWebhookEndpoint.UserErrors)

	var exported map[string]bool
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		exported = map[string]bool{}
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			name := line
			if i := strings.IndexAny(line, "{ "); i >= 0 {
				name = line[:i]
			}
			exported[name] = true
		}
		missing = missing[:0]
		for _, f := range []string{"../deploy/grafana-dashboard.json", "../deploy/alerts.yml"} {
			for _, n := range namesIn(t, f) {
				if !exported[n] {
					missing = append(missing, f+": "+n)
				}
			}
		}
		// The workers' gauges are set on their first pass.
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Empty(t, missing, "metrics deploy/ queries that /metrics does not export")
}
