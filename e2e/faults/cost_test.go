package faults

import (
	"bufio"
	"bytes"
	"context"
	pgwire "encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
)

// What a query may cost, against the real binary: every list is priced at
// the most items it can return and nested lists multiply, so the nested
// drop { products { drop { products ... } } } that used to return 200,000
// items from a 1.6 KB anonymous request is refused before it runs, and a
// query priced just under the limit runs in bounded memory and time.
func TestNestedListsAreRefusedBeforeTheyRun(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	pg := countStatements(t, s.PostgresVia)
	s.PostgresVia = pg.Addr
	p := s.start("a")
	costDrop(t, s, p, "NEST", 10)

	// The finding: twenty aliases of four nested drop.products over a
	// 10-SKU drop (10^4 items each), 2.2 KB. It used to be priced at 180
	// and to run for seconds while the server grew by hundreds of MB.
	var q strings.Builder
	q.WriteString("{")
	for i := range 20 {
		fmt.Fprintf(&q, ` a%d: drop(id: "NEST") { products { drop { products { drop { products { drop { products { sku } } } } } } } }`, i)
	}
	q.WriteString(" }")
	// Sent up to ten times, keeping the fewest statements: a worker may run
	// some of its own meanwhile (the queue admitter lists queues every 2 s,
	// the write-behind applies the drop's setup), and on a busy machine a
	// request of a few milliseconds can overlap them three times running.
	var (
		r     costResult
		took  time.Duration
		grew  int64
		peak  int64
		start time.Time
		read  = int64(1 << 40)
	)
	for try := 0; try < 10 && read > 0; try++ {
		before := pg.n.Load()
		peak = resetPeakRSS(t, p)
		start = time.Now()
		r = costPost(t, http.DefaultClient, p.URL, "", q.String())
		took = time.Since(start)
		grew = peakRSS(t, p) - peak
		read = min(read, pg.n.Load()-before)
		require.Len(t, r.Errors, 1)
		t.Logf("the nested query (%d bytes): %s, status %d, peak RSS +%.1f MiB, %d PostgreSQL statements",
			q.Len(), took.Round(time.Millisecond), r.Status, float64(grew)/1024, pg.n.Load()-before)
	}
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "COMPLEXITY_LIMIT_EXCEEDED", r.Errors[0].code())
	require.Nil(t, r.Data, "refused before it ran")
	requested := r.cost().RequestedQueryCost
	require.Greater(t, requested, 2000)
	require.Nil(t, r.cost().ActualQueryCost)
	require.Equal(t, float64(requested), r.Errors[0].Extensions["cost"].(map[string]any)["requestedQueryCost"])
	require.Zero(t, read, "nothing read")
	require.Less(t, took, 2*time.Second)

	// Just under the limit (956 of 2000, the rest in aliases of it would
	// go over): it runs, in bounded memory and time.
	for range 3 {
		peak = resetPeakRSS(t, p)
		start = time.Now()
		r = costPost(t, http.DefaultClient, p.URL, "", underLimit)
		took = time.Since(start)
		grew = peakRSS(t, p) - peak
		require.Equal(t, http.StatusOK, r.Status)
		require.Empty(t, r.Errors)
		require.Equal(t, 956, r.cost().RequestedQueryCost)
		require.Less(t, took, 2*time.Second)
		require.Less(t, grew, int64(64<<10), "peak RSS grew by %d KiB", grew)
	}
	t.Logf("the query just under the limit: %s, peak RSS +%.1f MiB", took.Round(time.Millisecond), float64(grew)/1024)
	var out struct {
		Drop struct {
			Products []struct {
				Sku  string
				Draw *struct{ Status string }
				Drop struct{ Name string }
			}
		}
		Product struct{ Draw *struct{ Status string } }
	}
	require.NoError(t, json.Unmarshal(r.Data, &out))
	require.Len(t, out.Drop.Products, 10)
	require.Nil(t, out.Drop.Products[0].Draw)
	require.Equal(t, "Drop NEST", out.Drop.Products[9].Drop.Name)
	require.Equal(t, "OPEN", out.Product.Draw.Status)
}

// underLimit is priced just under half the limit: a drop's every product
// with its stock, draw and drop (802), the catalogue's first page (151),
// and one product's draw (3).
const underLimit = `{
	drop(id: "NEST") { products { sku name stock { available } draw { status } drop { name } } }
	products(first: 50) { edges { node { sku } } }
	product(sku: "NEST-DRAW") { draw { status } }
}`

// List fields are batched per request: each kind of read (drops, products,
// draws, the stock) is one PostgreSQL statement (or Redis round trip) for
// the whole request, however many items of its lists ask for it, counted
// on the wire between the binary and PostgreSQL.
func TestListFieldsAreBatched(t *testing.T) {
	testenv.Quiet(t)
	s := newSystem(t)
	pg := countStatements(t, s.PostgresVia)
	s.PostgresVia = pg.Addr
	s.Env["DROPLINE_MUTATION_RATE"] = "-1" // the admin creates thirty products at once
	p := s.start("a")
	costDrop(t, s, p, "NEST", 10)

	// The fewest statements of up to ten runs of query, which stop at the
	// first within most: the counter sees the server's workers too (the
	// drawer lists due draws every 250 ms, the queue admitter its queues
	// every 2 s, the write-behind applies the products costDrop just made),
	// and on a busy machine a request of a few milliseconds can overlap
	// them three times running. A query whose statements grow with its
	// items exceeds most on every run.
	statements := func(query string, most int64) int64 {
		least := int64(1 << 40)
		for try := 0; try < 10 && least > most; try++ {
			before := pg.n.Load()
			r := costPost(t, http.DefaultClient, p.URL, "", query)
			require.Empty(t, r.Errors)
			n := pg.n.Load() - before
			if n > most {
				t.Logf("try %d: %d PostgreSQL statements, more than %d", try+1, n, most)
			}
			least = min(least, n)
		}
		return least
	}
	// The drop, its products, the catalogue page, the product, and the
	// draws: those of the drop's products come a level later than the
	// product's, so they are two batches, and a slow machine may split one.
	under := statements(underLimit, 7)
	t.Logf("the query just under the limit: %d PostgreSQL statements", under)
	require.LessOrEqual(t, under, int64(7))

	// Every product of the catalogue with its stock, draw and drop: the
	// page, the draws, the drops (the stock is Redis'); the same over 11
	// products and over 32.
	const catalogue = `{ products(first: 100) { edges { node { sku stock { available } draw { status } drop { name } } } } }`
	small := statements(catalogue, 4)
	costDrop(t, s, p, "MORE", 20)
	large := statements(catalogue, 4)
	t.Logf("the catalogue with draws and drops: %d statements over 11 products, %d over 32", small, large)
	require.LessOrEqual(t, small, int64(4), "three kinds of read; a slow machine may split a batch")
	require.LessOrEqual(t, large, int64(4), "statements do not grow with the items")
}

// Every response tells its cost in Shopify's shape: requested by the
// rules, actual by what ran, and the caller's budget. A refusal by the
// budget is a 429 with RateLimit, RateLimit-Policy and Retry-After, and
// carries the same facts in its error's extensions over HTTP, SSE and
// websockets.
func TestCostIsToldToTheClient(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_COST_RATE"] = "1" // so a spent budget stays spent while the test looks
	s.Env["DROPLINE_COST_BURST"] = "3000"
	p := s.start("a")
	costDrop(t, s, p, "TOLD", 10)

	// Requested by the rules (a drop's 100 SKUs at most), actual by what
	// ran (one per field resolved), and the budget lighter by the actual.
	r := costPost(t, http.DefaultClient, p.URL, "", `{ drop(id: "TOLD") { products { sku } } }`)
	require.Empty(t, r.Errors)
	c := r.cost()
	require.Equal(t, 1+1+100, c.RequestedQueryCost)
	require.Equal(t, 1+1+10, *c.ActualQueryCost)
	require.Equal(t, 3000, c.ThrottleStatus.MaximumAvailable)
	require.Equal(t, 1, c.ThrottleStatus.RestoreRate)
	require.InDelta(t, 3000-12, c.ThrottleStatus.CurrentlyAvailable, 2)
	require.Equal(t, `"cost";q=3000;w=3000`, r.Header.Get("RateLimit-Policy"))
	require.Equal(t, fmt.Sprintf(`"cost";r=%d;t=12`, c.ThrottleStatus.CurrentlyAvailable), r.Header.Get("RateLimit"))
	require.Empty(t, r.Header.Get("Retry-After"))

	// A mutation is priced and spends too.
	buyer := s.token("told-buyer", false)
	sent := time.Now()
	r = costPost(t, http.DefaultClient, p.URL, buyer, `mutation { reserve(input: {sku: "TOLD-01", quantity: 1}) { reservation { token } userErrors { code } } }`)
	took := time.Since(sent)
	require.Empty(t, r.Errors)
	require.Equal(t, 1+(1+1)+(1+1), r.cost().RequestedQueryCost)
	require.Equal(t, 1+(1+1)+1, *r.cost().ActualQueryCost, "an empty userErrors resolves no code")
	// The buyer's own budget, less the actual cost, plus what refilled (1
	// a second) while the reserve ran: nothing, unless it took a second.
	own := r.cost().ThrottleStatus.CurrentlyAvailable
	require.GreaterOrEqual(t, own, 3000-4, "the buyer's own budget")
	require.LessOrEqual(t, own, 3000-4+int(took.Seconds()), "the buyer's own budget")

	// Spend the address' budget: each query is priced 301 (a page of 100)
	// and costs 22 once run, so it takes about 130.
	const page = `{ products(first: 100) { edges { node { sku } } } }`
	refused, _ := untilRefused(t, http.DefaultClient, p.URL, page)
	require.Len(t, refused.Errors, 1)
	require.Nil(t, refused.Data, "nothing ran")
	retry, err := strconv.Atoi(refused.Header.Get("Retry-After"))
	require.NoError(t, err)
	left := refused.cost().ThrottleStatus.CurrentlyAvailable
	require.Less(t, left, 301)
	require.InDelta(t, 301-left, retry, 1, "seconds until the budget holds 301 again, at 1 a second")
	require.Equal(t, fmt.Sprintf(`"cost";r=%d;t=%d`, left, 3000-left), refused.Header.Get("RateLimit"))
	require.Equal(t, `"cost";q=3000;w=3000`, refused.Header.Get("RateLimit-Policy"))
	require.Equal(t, 301, refused.cost().RequestedQueryCost)
	require.Nil(t, refused.cost().ActualQueryCost, "nothing ran")
	e := refused.Errors[0].Extensions
	requireThrottled(t, e)
	require.Equal(t, float64(retry), e["retryAfterSeconds"])
	require.Equal(t, refused.Header.Get("RateLimit"), e["rateLimit"])

	// Over SSE and a websocket, the refusal carries the same facts in its
	// error's extensions. What the page left (up to 300) is spent first, so
	// that the budget holds 301 again only minutes later, however slowly
	// the two requests are sent.
	spendAll(t, http.DefaultClient, p.URL, `{ drop(id: "TOLD") { name } }`)
	sse := sseQuery(t, p.URL, page)
	require.Len(t, sse.Errors, 1)
	requireThrottled(t, sse.Errors[0].Extensions)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := wsclient.Dial(ctx, strings.Replace(p.URL, "http", "ws", 1)+"/graphql", wsclient.Options{})
	require.NoError(t, err)
	defer ws.CloseNow()
	sub, err := ws.Subscribe(ctx, page, nil)
	require.NoError(t, err)
	msg, ok, err := sub.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, msg.Errors, 1)
	requireThrottled(t, msg.Errors[0].Extensions)
}

// Anonymous queries spend their client address' budget: a flood from one
// address is refused, while another address, and a signed-in principal
// from the same one, are served.
func TestAnonymousBudgetIsPerAddress(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_COST_RATE"] = "1"
	s.Env["DROPLINE_COST_BURST"] = "3000"
	p := s.start("a")
	costDrop(t, s, p, "FLOOD", 10)

	const page = `{ products(first: 100) { edges { node { sku } } } }`
	refused, refusedAt := untilRefused(t, quickClient, p.URL, page)
	require.Equal(t, "RATE_LIMITED", refused.Errors[0].code())
	require.Positive(t, refusedAt, "the flood from one address was never refused")
	t.Logf("the flood from 127.0.0.1 was refused after %d queries", refusedAt)
	spendAll(t, quickClient, p.URL, `{ drop(id: "FLOOD") { name } }`) // so that it stays refused for minutes

	r := post(context.Background(), clientFrom("127.0.0.2"), p.URL, "", page, nil)
	require.NoError(t, r.Err)
	require.Equal(t, http.StatusOK, r.Status, "a second address has its own budget")
	require.Empty(t, r.Errors)
	r = post(context.Background(), quickClient, p.URL, s.token("flood-reader", false), page, nil)
	require.Equal(t, http.StatusOK, r.Status, "a signed-in principal has its own budget")
	require.Empty(t, r.Errors)
	r = post(context.Background(), quickClient, p.URL, "", page, nil)
	require.Equal(t, http.StatusTooManyRequests, r.Status, "the first address is still refused")
}

// A response has a bounded size: one that grows past
// DROPLINE_RESPONSE_MAX_BYTES stops being built (the fields it resolved,
// its actual cost, fall well short of what the whole would have) and is
// answered RESPONSE_TOO_LARGE.
func TestResponseSizeIsBounded(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_RESPONSE_MAX_BYTES"] = "2048"
	s.Env["DROPLINE_MUTATION_RATE"] = "-1" // the admin creates sixty products at once
	p := s.start("a")
	costDrop(t, s, p, "BIG", 60)

	const all = `{ products(first: 100) { edges { cursor node { id sku name price { amount currency } } } } }`
	r := costPost(t, http.DefaultClient, p.URL, "", all)
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, r.Errors, 1)
	require.Equal(t, "RESPONSE_TOO_LARGE", r.Errors[0].code())
	require.Equal(t, float64(2048), r.Errors[0].Extensions["limit"])
	require.JSONEq(t, "null", string(r.Data))
	whole := 1 + 1 + 60*(1+1+3+3)
	t.Logf("the response was stopped after %d of %d fields", *r.cost().ActualQueryCost, whole)
	require.Less(t, *r.cost().ActualQueryCost, whole/2, "it stopped being built")

	// A page that fits is answered whole.
	r = costPost(t, http.DefaultClient, p.URL, "", `{ products(first: 10) { edges { node { sku } } } }`)
	require.Empty(t, r.Errors)
	require.Equal(t, 1+1+10*2, *r.cost().ActualQueryCost)
}

// costDrop creates a drop of n SKUs, ID-00 and up, and a product ID-DRAW
// sold by draw (which no drop's product can be).
func costDrop(t *testing.T, s *system, p *proc, id string, n int) {
	t.Helper()
	admin := s.token("ops", true)
	var drop struct {
		CreateDrop struct{ UserErrors []userError } `json:"createDrop"`
	}
	s.mustGQL(p, admin, `mutation($i: CreateDropInput!) { createDrop(input: $i) { userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"id": id, "name": "Drop " + id, "maxPerUser": 2}}, &drop)
	require.Empty(t, drop.CreateDrop.UserErrors)
	for i := range n + 1 {
		in := map[string]any{"sku": fmt.Sprintf("%s-%02d", id, i), "name": "Size " + strconv.Itoa(i),
			"price": map[string]any{"amount": 12000, "currency": "EUR"}, "stock": 5, "drop": id}
		if i == n {
			delete(in, "drop")
			in["sku"] = id + "-DRAW"
			in["draw"] = map[string]any{"closesAt": time.Now().Add(time.Hour).Format(time.RFC3339), "winnerHoldSeconds": 600}
		}
		var out struct {
			CreateProduct struct{ UserErrors []userError } `json:"createProduct"`
		}
		s.mustGQL(p, admin, `mutation($i: CreateProductInput!) { createProduct(input: $i) { userErrors { code message } } }`,
			map[string]any{"i": in}, &out)
		require.Empty(t, out.CreateProduct.UserErrors)
	}
}

// costResult is a response with its headers and extensions.
type costResult struct {
	t          *testing.T
	Status     int
	Header     http.Header
	Data       json.RawMessage `json:"data"`
	Errors     []gqlError      `json:"errors"`
	Extensions struct {
		Cost *costExtension `json:"cost"`
	} `json:"extensions"`
}

type costExtension struct {
	RequestedQueryCost int  `json:"requestedQueryCost"`
	ActualQueryCost    *int `json:"actualQueryCost"`
	ThrottleStatus     *struct {
		MaximumAvailable   int `json:"maximumAvailable"`
		CurrentlyAvailable int `json:"currentlyAvailable"`
		RestoreRate        int `json:"restoreRate"`
	} `json:"throttleStatus"`
}

// cost is the response's extensions.cost, which every response has.
func (r costResult) cost() costExtension {
	r.t.Helper()
	require.NotNil(r.t, r.Extensions.Cost, "the response has no extensions.cost")
	return *r.Extensions.Cost
}

// untilRefused sends query anonymously until the budget refuses it, and
// returns the refusal and how many were served before it.
func untilRefused(t *testing.T, client *http.Client, base, query string) (costResult, int) {
	t.Helper()
	for served := range 1000 {
		if r := costPost(t, client, base, "", query); r.Status == http.StatusTooManyRequests {
			return r, served
		}
	}
	t.Fatalf("the budget never ran out: %s was served 1000 times", query)
	return costResult{}, 0
}

// spendAll sends the cheap query until the budget refuses it too: what is
// left is then less than the query's price, and a page of 100 (301) is
// refused until nearly 300 s of refill.
func spendAll(t *testing.T, client *http.Client, base, query string) {
	t.Helper()
	r, _ := untilRefused(t, client, base, query)
	require.Less(t, r.cost().ThrottleStatus.CurrentlyAvailable, r.cost().RequestedQueryCost)
}

func costPost(t *testing.T, client *http.Client, base, token, query string) costResult {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := costResult{t: t, Status: resp.StatusCode, Header: resp.Header}
	require.NoError(t, json.Unmarshal(b, &r), "%.300s", b)
	return r
}

// sseQuery runs a query over GraphQL over SSE and returns its one result.
func sseQuery(t *testing.T, base, query string) wsclient.Message {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "" {
			var m wsclient.Message
			require.NoError(t, json.Unmarshal([]byte(data), &m))
			return m
		}
	}
	t.Fatalf("no event in the SSE response (status %d)", resp.StatusCode)
	return wsclient.Message{}
}

func requireThrottled(t *testing.T, ext map[string]any) {
	t.Helper()
	require.Equal(t, "RATE_LIMITED", ext["code"])
	require.Positive(t, ext["retryAfterSeconds"])
	require.Regexp(t, `^"cost";r=\d+;t=\d+$`, ext["rateLimit"])
	require.Equal(t, `"cost";q=3000;w=3000`, ext["rateLimitPolicy"])
	cost, ok := ext["cost"].(map[string]any)
	require.True(t, ok, "the error's extensions have the cost")
	require.Equal(t, float64(301), cost["requestedQueryCost"])
	require.Nil(t, cost["actualQueryCost"])
}

// resetPeakRSS resets the process' peak resident set (VmHWM) to what it
// has now, and returns that, in KiB as peakRSS.
func resetPeakRSS(t *testing.T, p *proc) int64 {
	t.Helper()
	require.NoError(t, os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0))
	return peakRSS(t, p)
}

// statementCounter is a proxy between Dropline and PostgreSQL that counts
// the statements Dropline sends: each Execute of the extended protocol and
// each simple Query.
type statementCounter struct {
	Addr string
	n    atomic.Int64
}

func countStatements(t *testing.T, upstream string) *statementCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &statementCounter{Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(client, server)
				_ = client.Close()
			}()
			go func() {
				defer wg.Done()
				_ = c.relay(bufio.NewReader(client), server)
				_ = server.Close()
			}()
		}
	}()
	return c
}

// relay forwards the client's messages, counting statements: first the
// untyped startup messages (an SSLRequest or GSSENCRequest is followed by
// another), then typed ones.
func (c *statementCounter) relay(r *bufio.Reader, w io.Writer) error {
	head := make([]byte, 8)
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			return err
		}
		n := int(pgwire.BigEndian.Uint32(head[:4]))
		code := pgwire.BigEndian.Uint32(head[4:8])
		if _, err := w.Write(head); err != nil {
			return err
		}
		if _, err := io.CopyN(w, r, int64(n-8)); err != nil {
			return err
		}
		if code != 80877103 && code != 80877104 { // SSLRequest, GSSENCRequest
			break
		}
	}
	for {
		typ, err := r.ReadByte()
		if err != nil {
			return err
		}
		if _, err := io.ReadFull(r, head[:4]); err != nil {
			return err
		}
		if typ == 'E' || typ == 'Q' {
			c.n.Add(1)
		}
		if _, err := w.Write(append([]byte{typ}, head[:4]...)); err != nil {
			return err
		}
		if _, err := io.CopyN(w, r, int64(pgwire.BigEndian.Uint32(head[:4]))-4); err != nil {
			return err
		}
	}
}
