package graphql_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/graphqltest"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
)

func TestPriorityOperations(t *testing.T) {
	t.Parallel()
	for query, want := range map[string]bool{
		`mutation { commit(input: {token: "t"}) { userErrors { code } } }`:                                                           true,
		`mutation { a: commit(input: {token: "t"}) { userErrors { code } } b: cancel(input: {token: "u"}) { userErrors { code } } }`: true,
		`mutation { commitCart(input: {token: "t"}) { userErrors { code } } __typename }`:                                            true,
		`mutation { ... on Mutation { cancelCart(input: {token: "t"}) { userErrors { code } } } }`:                                   true,
		`mutation { commit(input: {token: "t"}) { userErrors { code } } reserve(input: {sku: "s"}) { userErrors { code } } }`:        false,
		`mutation { reserve(input: {sku: "s"}) { userErrors { code } } }`:                                                            false,
		`mutation { __typename }`: false,
		`query { commit }`:        false,
	} {
		got, err := graphql.IsPriority(query)
		require.NoError(t, err)
		require.Equal(t, want, got, query)
	}
}

// gated is a handler over a test's engine whose gate the test holds, and
// the registry of the gate's metrics.
func gated(t *testing.T, slots int, wait time.Duration) (*env, *graphql.TestGate, *prometheus.Registry, http.Handler) {
	t.Helper()
	var cfg *graphql.Config
	e := setup(t, func(c *graphql.Config) { cfg = c })
	reg := prometheus.NewRegistry()
	g := graphql.NewTestGate(slots, wait, reg)
	c := *cfg
	c.Registerer = reg
	return e, g, reg, server.RequestID(zerolog.Nop(), graphql.NewHandlerGated(c, g))
}

// TestGateServesCommitsAheadAndOthersInOrder: with the gate's only slot
// taken, reserves wait (parked, counted as waiting) while a commit and a
// cancel go straight through; once the slot is given back the waiting
// reserves run and each holds its unit.
func TestGateServesCommitsAheadAndOthersInOrder(t *testing.T) {
	t.Parallel()
	e, g, reg, h := gated(t, 1, time.Minute)
	c := client.New(h)
	e.CreateProduct(t, map[string]any{"sku": "GATE-1", "stock": 20})
	buyer := e.Token(t, "buyer", false)
	h1 := e.Reserve(t, buyer, map[string]any{"sku": "GATE-1", "quantity": 1})
	h2 := e.Reserve(t, buyer, map[string]any{"sku": "GATE-1", "quantity": 1})
	require.NotNil(t, h1.Reservation)
	require.NotNil(t, h2.Reservation)

	waiting := func() float64 { return metric(t, reg, "dropline_graphql_gate_waiting", "") }
	g.Hold()
	const n = 5
	type result struct {
		i         int
		available int
		errs      []gqlError
	}
	results := make(chan result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out struct {
				Reserve graphqltest.Payload
			}
			errs := do(c, e.Token(t, fmt.Sprintf("w%d", i), false), graphqltest.ReserveDoc,
				map[string]any{"i": map[string]any{"sku": "GATE-1", "quantity": 1}}, &out)
			r := result{i: i, errs: errs}
			if out.Reserve.Reservation != nil {
				r.available = out.Reserve.Reservation.Product.Stock.Available
			}
			results <- r
		}()
		require.Eventually(t, func() bool { return waiting() == float64(i+1) }, 5*time.Second, time.Millisecond,
			"reserve %d waits at the gate", i)
	}

	// Priority operations are not held by the full gate.
	done := make(chan []gqlError, 2)
	go func() {
		var out struct{ Commit graphqltest.Payload }
		errs := do(c, buyer, graphqltest.CommitDoc, map[string]any{"i": map[string]any{"token": h1.Reservation.Token}}, &out)
		if len(errs) == 0 && (out.Commit.Reservation == nil || out.Commit.Reservation.Status != "COMMITTED") {
			errs = []gqlError{{Message: fmt.Sprintf("not committed: %+v", out.Commit)}}
		}
		done <- errs
	}()
	go func() {
		var out struct{ Cancel graphqltest.Payload }
		errs := do(c, buyer, graphqltest.CancelDoc, map[string]any{"i": map[string]any{"token": h2.Reservation.Token}}, &out)
		if len(errs) == 0 && (out.Cancel.Reservation == nil || out.Cancel.Reservation.Status != "CANCELLED") {
			errs = []gqlError{{Message: fmt.Sprintf("not cancelled: %+v", out.Cancel)}}
		}
		done <- errs
	}()
	for range 2 {
		select {
		case errs := <-done:
			require.Empty(t, errs)
		case <-time.After(10 * time.Second):
			t.Fatal("a commit or cancel waited behind the full gate")
		}
	}
	require.Equal(t, float64(n), waiting(), "the ordinary operations still wait")
	require.Empty(t, results, "nothing ordinary ran while the slot was held")
	require.Equal(t, 2.0, metric(t, reg, "dropline_graphql_gate_admitted_total", "priority"))
	require.Equal(t, 0.0, metric(t, reg, "dropline_graphql_gate_admitted_total", "ordinary"))

	// Now they run: each holds its unit (the order in which waiting
	// requests get their slots is cpugate's, tested there).
	g.Release()
	wg.Wait()
	close(results)
	for r := range results {
		require.Empty(t, r.errs, "reserve %d", r.i)
		require.GreaterOrEqual(t, r.available, 20-1-n, "reserve %d", r.i)
	}
	require.Equal(t, 20-1-n, e.Truth(t, "GATE-1").Available, "every waiting reserve held its unit")
	require.Equal(t, float64(n), metric(t, reg, "dropline_graphql_gate_admitted_total", "ordinary"))
	require.Zero(t, waiting())
}

// TestGateBoundsTheWait: an operation that waits longer than the gate's
// bound is answered SERVER_BUSY, and one whose client leaves stops waiting
// and is answered nothing; neither keeps a slot.
func TestGateBoundsTheWait(t *testing.T) {
	t.Parallel()
	_, g, reg, h := gated(t, 1, 200*time.Millisecond)
	c := client.New(h)
	g.Hold()
	start := time.Now()
	errs := do(c, "", `{ __typename }`, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, graphql.CodeBusy, errs[0].Code())
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	// A client that leaves after 50 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/graphql", strings.NewReader(`{"query":"{ __typename }"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Empty(t, rec.Body.String(), "nothing is written to a client that left")

	require.Equal(t, 1.0, metric(t, reg, "dropline_graphql_gate_refused_total", "timeout"))
	require.Equal(t, 1.0, metric(t, reg, "dropline_graphql_gate_refused_total", "gone"))
	require.Zero(t, metric(t, reg, "dropline_graphql_gate_waiting", ""))
	g.Release()
	require.Empty(t, do(c, "", `{ __typename }`, nil, nil), "the slot is free again")
	require.Zero(t, metric(t, reg, "dropline_graphql_gate_in_use", ""))
}

func do(c *client.Client, authz, query string, vars map[string]any, out any) []gqlError {
	opts := []client.Option{}
	if authz != "" {
		opts = append(opts, client.AddHeader("Authorization", authz))
	}
	for k, v := range vars {
		opts = append(opts, client.Var(k, v))
	}
	resp, err := c.RawPost(query, opts...)
	if err != nil {
		return []gqlError{{Message: err.Error()}}
	}
	if out != nil && resp.Data != nil {
		b, err := json.Marshal(resp.Data)
		if err == nil {
			err = json.Unmarshal(b, out)
		}
		if err != nil {
			return []gqlError{{Message: err.Error()}}
		}
	}
	var errs []gqlError
	if len(resp.Errors) > 0 {
		if err := json.Unmarshal(resp.Errors, &errs); err != nil {
			return []gqlError{{Message: err.Error()}}
		}
	}
	return errs
}

// metric is the value of the series name in reg whose one label is label
// ("" for a series without labels), 0 when there is none.
func metric(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
