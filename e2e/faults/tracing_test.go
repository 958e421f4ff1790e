package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/dropline/dropline/internal/otlpreceiver"
)

// otlpReceiver is a real OTLP/HTTP trace receiver: it decodes the protobuf
// ExportTraceServiceRequest each POST /v1/traces carries, as a collector
// would (internal/otlpreceiver), and keeps every span.
type otlpReceiver struct {
	URL string

	mu       sync.Mutex
	spans    []recvSpan
	requests int
}

// recvSpan is one received span, ids in hex.
type recvSpan struct {
	Name    string
	TraceID string
	SpanID  string
	Parent  string
	Links   []recvLink
	Service string
}

type recvLink struct{ TraceID, SpanID string }

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewServer(otlpreceiver.Handler(func(export *coltracepb.ExportTraceServiceRequest) {
		var got []recvSpan
		for _, rs := range export.GetResourceSpans() {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					s := recvSpan{
						Name: sp.GetName(), TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
						Parent: hex.EncodeToString(sp.GetParentSpanId()), Service: service,
					}
					for _, l := range sp.GetLinks() {
						s.Links = append(s.Links, recvLink{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
					}
					got = append(got, s)
				}
			}
		}
		r.mu.Lock()
		r.spans = append(r.spans, got...)
		r.requests++
		r.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *otlpReceiver) all() []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recvSpan(nil), r.spans...)
}

func (r *otlpReceiver) exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// inTrace returns the received spans of trace id.
func (r *otlpReceiver) inTrace(id string) []recvSpan {
	var out []recvSpan
	for _, s := range r.all() {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

// children returns the spans whose parent is span id parent, named name
// ("" for any name).
func children(spans []recvSpan, parent, name string) []recvSpan {
	var out []recvSpan
	for _, s := range spans {
		if s.Parent == parent && (name == "" || s.Name == name) {
			out = append(out, s)
		}
	}
	return out
}

// postTraced sends one operation with a traceparent and returns the body.
func postTraced(ctx context.Context, base, token, traceparent, query, operation string, vars map[string]any) ([]byte, error) {
	body, _ := json.Marshal(map[string]any{"query": query, "operationName": operation, "variables": vars})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req) // bounded by ctx
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func named(spans []recvSpan, name string) []recvSpan {
	var out []recvSpan
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// reserveTraced reserves one unit of sku for user, sending traceparent.
func reserveTraced(ctx context.Context, base, token, traceparent, sku, key string) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"query": `mutation Reserve($input: ReserveInput!) { reserve(input: $input) {
			reservation { token status } userErrors { code message } } }`,
		"operationName": "Reserve",
		"variables":     map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "idempotencyKey": key}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req) // bounded by ctx
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Reserve struct {
				Reservation *struct {
					Token  string `json:"token"`
					Status string `json:"status"`
				} `json:"reservation"`
				UserErrors []userError `json:"userErrors"`
			} `json:"reserve"`
		} `json:"data"`
		Errors []gqlError `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	if len(out.Errors) > 0 || out.Data.Reserve.Reservation == nil {
		return "", fmt.Errorf("reserve answered %+v", out)
	}
	return out.Data.Reserve.Reservation.Token, nil
}

// TestTracesOfOneReserve runs the real binary with OTEL_EXPORTER_OTLP_ENDPOINT
// pointing at an in-process OTLP receiver and sends one reserve with a W3C
// traceparent: the operation, the run of reserve.lua that decided it and the
// write-behind that recorded its hold all arrive in that trace, each under
// the span it belongs to; the write-behind batch's PostgreSQL transaction,
// and a traced commit's, are one span each with their statements under
// it. Then many reserves at once: every run of
// reserve.lua links the spans of the reserves it decided, every reserve is
// linked from exactly one run, and some runs decided several.
func TestTracesOfOneReserve(t *testing.T) {
	recv := startOTLPReceiver(t)
	s := newSystem(t)
	s.Env["OTEL_EXPORTER_OTLP_ENDPOINT"] = recv.URL
	s.Env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
	s.Env["OTEL_SERVICE_NAME"] = "dropline-e2e"
	p := s.start("traced")
	s.createProduct(p, "TRACED-1", 1000, 0)

	// Each request is bounded by a context of its step's own: the waits for
	// spans between them are not part of any request's time.
	step := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	traceID, parent := randomHex(t, 16), randomHex(t, 8)
	tok, err := reserveTraced(step(15*time.Second), p.URL, s.token("alice", false), "00-"+traceID+"-"+parent+"-01", "TRACED-1", "one")
	require.NoError(t, err)

	var op, script, record recvSpan
	eventually(t, 20*time.Second, "the operation, script and write-behind spans of the traced reserve", func() (bool, string) {
		spans := recv.inTrace(traceID)
		ops, scripts, records := named(spans, "mutation Reserve"), named(spans, "script reserve"), named(spans, "write-behind record reserve")
		if len(ops) != 1 || len(scripts) != 1 || len(records) != 1 {
			return false, fmt.Sprintf("%d spans in the trace: %+v", len(spans), spans)
		}
		op, script, record = ops[0], scripts[0], records[0]
		return true, ""
	})
	require.Equal(t, parent, op.Parent, "the operation continues the caller's span")
	require.Equal(t, "dropline-e2e", op.Service)
	require.Equal(t, op.SpanID, script.Parent, "the script run is a child of the operation that started it")
	require.Contains(t, script.Links, recvLink{TraceID: traceID, SpanID: op.SpanID}, "the run links the reserve it decided")
	require.Contains(t, op.Links, recvLink{TraceID: traceID, SpanID: script.SpanID}, "the reserve links the run that decided it")
	require.Equal(t, op.SpanID, record.Parent, "the write-behind record continues the reserve's trace")
	require.Len(t, record.Links, 1, "and links its batch")
	// The batch's span ends after the record's and may come in a later
	// export than the one that brought the record: wait for it.
	var applies []recvSpan
	eventually(t, 20*time.Second, "the write-behind batch's span", func() (bool, string) {
		applies = applies[:0]
		for _, sp := range recv.all() {
			if sp.Name == "write-behind apply" && sp.SpanID == record.Links[0].SpanID {
				applies = append(applies, sp)
			}
		}
		return len(applies) > 0, "no span of the batch the record links"
	})
	require.Len(t, applies, 1, "the write-behind batch's span arrived once")
	require.Contains(t, applies[0].Links, recvLink{TraceID: traceID, SpanID: op.SpanID}, "the batch links the reserve whose hold it recorded")
	require.Equal(t, 1, s.scalar(`SELECT count(*)::int FROM reservations WHERE token = $1`, tok), "the hold reached the ledger")

	// The batch's PostgreSQL transaction is one span under the batch, with
	// its statements under it.
	eventually(t, 20*time.Second, "the write-behind batch's transaction span", func() (bool, string) {
		txs := children(recv.all(), record.Links[0].SpanID, "transaction apply_events")
		if len(txs) != 1 {
			return false, fmt.Sprintf("%d transaction spans under the batch", len(txs))
		}
		return len(children(recv.all(), txs[0].SpanID, "")) > 0, "no statement span under the transaction"
	})

	// A traced commit: its sale's transaction is one span in the commit's
	// trace, its statements under it, and no other transaction span there.
	commitTrace := randomHex(t, 16)
	body, err := postTraced(step(15*time.Second), p.URL, s.token("alice", false), "00-"+commitTrace+"-"+randomHex(t, 8)+"-01",
		`mutation Commit($token: ID!) { commit(input: {token: $token}) { reservation { status } userErrors { code } } }`,
		"Commit", map[string]any{"token": tok})
	require.NoError(t, err)
	require.Contains(t, string(body), `"COMMITTED"`)
	eventually(t, 20*time.Second, "the commit's transaction span", func() (bool, string) {
		spans := recv.inTrace(commitTrace)
		ops, txs := named(spans, "mutation Commit"), named(spans, "transaction record_sale")
		if len(ops) != 1 || len(txs) != 1 {
			return false, fmt.Sprintf("%d spans in the trace: %+v", len(spans), spans)
		}
		var stmts []recvSpan
		for _, sp := range spans {
			if sp.Parent == txs[0].SpanID {
				stmts = append(stmts, sp)
			}
		}
		return len(stmts) > 0, fmt.Sprintf("no statement under the transaction: %+v", spans)
	})

	// Many reserves at once, one trace each.
	const n = 200
	ids, parents := make([]string, n), make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	ctx := step(60 * time.Second) // 200 at once on a race build, on a loaded machine
	for i := range n {
		ids[i], parents[i] = randomHex(t, 16), randomHex(t, 8)
		tok := s.token(fmt.Sprintf("buyer-%04d", i), false)
		wg.Go(func() {
			<-start
			_, errs[i] = reserveTraced(ctx, p.URL, tok, "00-"+ids[i]+"-"+parents[i]+"-01", "TRACED-1", "many")
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	opSpan := map[string]string{} // trace id -> operation span id
	eventually(t, 20*time.Second, "every reserve's operation span", func() (bool, string) {
		for _, sp := range recv.all() {
			if sp.Name == "mutation Reserve" {
				opSpan[sp.TraceID] = sp.SpanID
			}
		}
		missing := 0
		for _, id := range ids {
			if opSpan[id] == "" {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d operation spans missing", missing)
	})
	linkedFrom := map[string]int{}
	largest := 0
	eventually(t, 20*time.Second, "a run of reserve.lua linking each reserve", func() (bool, string) {
		clear(linkedFrom)
		largest = 0
		for _, sp := range recv.all() {
			if sp.Name != "script reserve" {
				continue
			}
			largest = max(largest, len(sp.Links))
			for _, l := range sp.Links {
				if opSpan[l.TraceID] == l.SpanID {
					linkedFrom[l.TraceID]++
				}
			}
		}
		for _, id := range ids {
			if linkedFrom[id] == 0 {
				return false, "reserve " + id + " is linked from no run"
			}
		}
		return true, ""
	})
	for _, id := range ids {
		require.Equal(t, 1, linkedFrom[id], "reserve %s is linked from exactly one run", id)
	}
	require.Greater(t, largest, 1, "some run decided several reserves together (group commit)")
	t.Logf("FIGURES: %d concurrent reserves, largest run of reserve.lua linked %d of them; %d exports received", n, largest, recv.exports())
}
