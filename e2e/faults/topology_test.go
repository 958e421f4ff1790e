package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/loopback"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/inventory"
)

// TestProductionTopology runs the deployment docs/operations.md describes,
// every part a real process on loopback: nginx (deploy/nginx.conf with its
// ports replaced) in front of two `dropline serve` instances, a Redis
// primary with a replica under three sentinels, and Postgres. A drop runs
// through nginx, its buyers leaving from many loopback addresses, while
// websocket and SSE subscribers follow the stock through nginx too.
// Mid-drop the Redis primary is killed (SIGKILL) and the sentinels promote
// the replica; a little later one Dropline instance is killed as well.
//
// Afterwards: nothing oversold, every acknowledged commit a sale, the
// ledger and Redis agree row by row (the fault suite's own checks, which
// allow holds lost with Redis), every subscriber converges on the final
// stock, a new SSE subscriber sees a change at rest within a second
// through nginx, and the per-address stream cap counts the clients'
// own addresses, not nginx's: a spoofed X-Forwarded-For does not help.
// It runs twice, without and with DROPLINE_REDIS_WAIT_REPLICAS=1, and
// prints the acknowledged holds the failover lost and how long reserves
// failed after the primary died (FIGURES lines).
func TestProductionTopology(t *testing.T) {
	testenv.Quiet(t)
	for _, tc := range []struct {
		name string
		wait int
	}{{"async", 0}, {"wait1", 1}} {
		t.Run(tc.name, func(t *testing.T) { runTopology(t, tc.wait) })
	}
}

// streamCap is DROPLINE_STREAM_CONNS_PER_IP in the topology: small, so the
// test meets it with a few connections.
const streamCap = 4

func runTopology(t *testing.T, waitReplicas int) {
	start := time.Now()
	s, set := newTopologySystem(t)
	s.Env["DROPLINE_TRUSTED_PROXIES"] = "127.0.0.1"
	s.Env["DROPLINE_STREAM_CONNS_PER_IP"] = strconv.Itoa(streamCap)
	s.Env["DROPLINE_LEASE_TTL"] = "3s"
	s.Env["DROPLINE_MUTATION_RATE"] = "-1"
	if waitReplicas > 0 {
		s.Env["DROPLINE_REDIS_WAIT_REPLICAS"] = strconv.Itoa(waitReplicas)
		s.Env["DROPLINE_REDIS_WAIT_TIMEOUT"] = "100ms"
	}
	a := s.start("a")
	b := s.start("b")
	s.Front = startNginx(t, a, b)
	t.Logf("topology up in %s: nginx %s, dropline %s and %s, redis %s (replica %s), sentinels %v",
		time.Since(start).Round(time.Millisecond), s.Front, a.URL, b.URL, set.Primary.Addr, set.Replica.Addr, set.SentinelAddrs())

	sku := "TOPO-" + strconv.Itoa(waitReplicas)
	s.createProduct(a, sku, 60, 0)
	s.createProduct(a, sku+"-PROBE", 100000, 0)

	// Subscribers through nginx: one websocket and one SSE stream from each
	// of four addresses (two connections each, under the cap).
	ctx, stopFollowers := context.WithCancel(context.Background())
	defer stopFollowers()
	var followers []*follower
	for i := range 4 {
		ip := fmt.Sprintf("127.0.0.%d", 31+i)
		followers = append(followers, followWS(ctx, s.Front, ip, sku), followSSE(ctx, s.Front, ip, sku))
	}
	for _, f := range followers {
		f.waitFirst(t, 10*time.Second)
	}

	// The drop, with a prober that reserves one unit of another SKU every
	// 20 ms, to time the outage.
	d := startDropOn(s, dropConfig{SKU: sku, Total: 60, Buyers: 220, Concurrency: 16, Pace: 35 * time.Millisecond,
		HoldSeconds: 3, Within: 60 * time.Second, Client: spreadClient(20)})
	pr := startProber(s, sku+"-PROBE")
	defer pr.stop()

	d.waitProgress(t, 60)
	killed := time.Now()
	set.Primary.Stop()
	t.Logf("Redis primary killed after %d buyers", d.Finished.Load())
	d.waitProgress(t, 110)
	b.kill(t)
	t.Logf("dropline b killed after %d buyers", d.Finished.Load())
	d.wait(t)
	recovered, failedFor := pr.recovery(killed)
	pr.stop()
	require.True(t, recovered, "reserves never worked again after the primary died")

	// A hold the old primary took and wrote to the outbox, whose batch the
	// killed instance had written to the ledger but not reconciled, is HELD
	// in the ledger and in no Redis: the commit reconciler closes such rows
	// 30 s past their expiry (the last net), so the ledger may take that long.
	// The prober's SKU settles too: verify counts the whole ledger's
	// movements, which must not grow meanwhile.
	s.settledOrExplain(t, sku, 60*time.Second)
	s.settled(t, sku+"-PROBE", 60*time.Second)
	d.verify(t, verifyOpts{RedisLost: true})
	d.mu.Lock()
	tokens := make([]string, 0, len(d.holds))
	for tok := range d.holds {
		tokens = append(tokens, tok)
	}
	committed := len(d.committed)
	refused := map[string]int{}
	var vanished []string // the holder's commit or cancel found no hold
	for tok, code := range d.refused {
		refused[code]++
		if code == "NOT_FOUND" {
			vanished = append(vanished, tok)
		}
	}
	d.mu.Unlock()
	// Lost: acknowledged holds the ledger never heard of, and those whose
	// holder came back to find nothing.
	lost := s.scalar(`SELECT count(*)::int FROM unnest($1::text[]) AS t(token)
		WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.token = t.token) OR t.token = ANY($2)`, tokens, vanished)
	final := s.stockOf(sku)

	// Subscribers converge on the final stock.
	for _, f := range followers {
		require.NoError(t, f.waitFor(final, 10*time.Second), "%s subscriber from %s", f.kind, f.ip)
	}
	reconnects := 0
	for _, f := range followers {
		reconnects += int(f.reconnects.Load())
	}

	// At rest, a change reaches a new SSE subscriber through nginx at once.
	probe := sku + "-PROBE"
	sse := followSSE(ctx, s.Front, "127.0.0.40", probe)
	sse.waitFirst(t, 10*time.Second)
	changed := time.Now()
	hold := s.reserveVia(t, probe, "late-buyer")
	after := s.stockOf(probe)
	require.NoError(t, sse.waitFor(after, time.Second), "a change reaches an SSE subscriber through nginx")
	sseLatency := sse.lastAt().Sub(changed)
	s.cancelVia(t, hold, "late-buyer")

	// The per-address cap counts the client's own address behind nginx.
	// Only instance a is left, so the cap is streamCap per address.
	capIP := "127.0.0.50"
	var open []*wsclient.Client
	for i := range streamCap {
		c, err := dialWS(s.Front, capIP, "")
		require.NoError(t, err, "connection %d from %s", i+1, capIP)
		open = append(open, c)
	}
	_, err := dialWS(s.Front, capIP, "")
	require.ErrorContains(t, err, "429", "one more from %s is over the cap", capIP)
	_, err = dialWS(s.Front, capIP, "198.51.100.7")
	require.ErrorContains(t, err, "429", "a forged X-Forwarded-For from %s does not escape the cap", capIP)
	c, err := dialWS(s.Front, "127.0.0.51", "")
	require.NoError(t, err, "another client address has its own slots")
	open = append(open, c)
	for _, c := range open {
		_ = c.Close()
	}

	stopFollowers()
	t.Logf("FIGURES topology %s: buyers=%d holds=%d commits=%d sold=%d refused=%v holds_lost_in_failover=%d reserves_failed_for=%s subscribers=%d resubscriptions=%d sse_latency_at_rest=%s wall=%s",
		map[int]string{0: "without WAIT", 1: "with WAIT 1 (100ms)"}[waitReplicas],
		d.Finished.Load(), len(tokens), committed, final.Sold, refused, lost, failedFor.Round(time.Millisecond),
		len(followers), reconnects, sseLatency.Round(time.Millisecond), time.Since(start).Round(time.Second))
}

// newTopologySystem is newSystem on a primary with a replica under three
// sentinels: the processes get REDIS_URL=redis-sentinel://..., the test's
// own checks a failover client.
func newTopologySystem(t *testing.T) (*system, *testenv.Replicated) {
	t.Helper()
	set := testenv.StartReplicated(t, time.Second)
	rdb := set.Client(t)
	dbURL := testenv.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	iss, err := auth.NewIssuer([]byte(testSecret))
	require.NoError(t, err)
	s := &system{
		t: t, Redis: set.Primary, RDB: rdb, DBURL: dbURL, Pool: pool, Issuer: iss, Keys: inventory.NewKeys(keyPrefix),
		RedisVia: set.Primary.Addr, PostgresVia: hostOf(t, dbURL), Env: map[string]string{"REDIS_URL": set.URL()},
	}
	t.Cleanup(s.stopAll)
	return s, set
}

func hostOf(t *testing.T, dbURL string) string {
	t.Helper()
	m := regexp.MustCompile(`@([^/]+)/`).FindStringSubmatch(dbURL)
	require.Len(t, m, 2, dbURL)
	return m[1]
}

// startNginx renders deploy/nginx.conf for the instances (its listen port
// and upstream servers replaced; logs and temporary files in the test's
// directory) and runs nginx in the foreground until the test ends.
func startNginx(t *testing.T, instances ...*proc) string {
	t.Helper()
	path, err := exec.LookPath("nginx")
	if err != nil {
		path, err = exec.LookPath("/usr/sbin/nginx") // not on a user's PATH
	}
	require.NoError(t, err, "nginx is not installed: `make tools` installs nginx-light")
	src, err := os.ReadFile("../../deploy/nginx.conf")
	require.NoError(t, err)
	dir := t.TempDir()
	port, err := loopback.FreePort()
	require.NoError(t, err)
	conf := string(src)
	listen := regexp.MustCompile(`(?m)^(\s*)listen 8080;`)
	require.True(t, listen.MatchString(conf), "deploy/nginx.conf listens on 8080")
	conf = listen.ReplaceAllString(conf, "${1}listen 127.0.0.1:"+strconv.Itoa(port)+";")
	servers := regexp.MustCompile(`(?m)^(\s*)server 127\.0\.0\.1:808[12]( [^;]*);\n`)
	require.Len(t, servers.FindAllString(conf, -1), 2, "deploy/nginx.conf lists two example instances")
	var lines strings.Builder
	for _, p := range instances {
		fmt.Fprintf(&lines, "        server %s max_fails=1 fail_timeout=2s;\n", strings.TrimPrefix(p.URL, "http://"))
	}
	first := true
	conf = servers.ReplaceAllStringFunc(conf, func(string) string {
		if first {
			first = false
			return lines.String()
		}
		return ""
	})
	local := ""
	for _, d := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		local += fmt.Sprintf("    %s_temp_path %s;\n", d, filepath.Join(dir, d))
	}
	local += fmt.Sprintf("    access_log %s;\n", filepath.Join(dir, "access.log"))
	conf = strings.Replace(conf, "http {\n", "http {\n"+local, 1)
	confPath := filepath.Join(dir, "nginx.conf")
	require.NoError(t, os.WriteFile(confPath, []byte(conf), 0o600))
	global := fmt.Sprintf("daemon off; pid %s; error_log %s warn;", filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "error.log"))
	if os.Geteuid() == 0 {
		global += " user root;" // the test directory is root's alone
	}
	cmd := exec.Command(path, "-p", dir, "-c", confPath, "-g", global) //nolint:gosec // the test's own nginx
	out, err := os.Create(filepath.Join(dir, "nginx.out"))
	require.NoError(t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	// Stopped with SIGTERM: the master stops its workers and exits; SIGKILL
	// would leave the workers running.
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			o, _ := os.ReadFile(filepath.Join(dir, "nginx.out"))
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error log:\n%s%s", o, b)
		}
	})
	front := "http://127.0.0.1:" + strconv.Itoa(port)
	eventually(t, 10*time.Second, "nginx answers", func() (bool, string) {
		resp, err := quickClient.Get(front + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return front
}

// spreadClient is an HTTP client whose connections leave from n loopback
// addresses in turn (127.0.0.100 and up), as many clients behind nginx.
func spreadClient(n int) *http.Client {
	var next atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		ip := net.ParseIP(fmt.Sprintf("127.0.0.%d", 100+int(next.Add(1))%n))
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
		return d.DialContext(ctx, network, addr)
	}}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4}}
}

// dialWS opens a websocket through nginx from ip, with a forged
// X-Forwarded-For when xff is set.
func dialWS(front, ip, xff string) (*wsclient.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h := http.Header{}
	if xff != "" {
		h.Set("X-Forwarded-For", xff)
	}
	return wsclient.Dial(ctx, "ws"+strings.TrimPrefix(front, "http")+"/graphql", wsclient.Options{HTTPClient: clientFrom(ip), Header: h})
}

// startDropOn starts a drop whose product already exists.
func startDropOn(s *system, cfg dropConfig) *drop {
	cfg.defaults()
	d := &drop{
		cfg: cfg, s: s,
		holds: map[string]holdInfo{}, committed: map[string]bool{}, cancelled: map[string]bool{}, refused: map[string]string{},
		served: map[string]int{}, done: make(chan struct{}), stop: make(chan struct{}),
	}
	go d.run()
	return d
}

// follower follows one SKU's stock through nginx over a websocket or SSE,
// subscribing again whenever the stream ends (its instance died), and keeps
// the newest value.
type follower struct {
	kind, ip   string
	reconnects atomic.Int64

	mu   sync.Mutex
	last stock
	at   time.Time
	got  chan struct{} // a value arrived (capacity 1)
}

func newFollower(kind, ip string) *follower {
	return &follower{kind: kind, ip: ip, got: make(chan struct{}, 1)}
}

func (f *follower) set(st stock) {
	f.mu.Lock()
	f.last, f.at = st, time.Now()
	f.mu.Unlock()
	select {
	case f.got <- struct{}{}:
	default:
	}
}

func (f *follower) lastAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.at
}

func (f *follower) waitFirst(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-f.got:
		f.got <- struct{}{}
	case <-time.After(within):
		t.Fatalf("%s subscriber from %s got nothing within %s", f.kind, f.ip, within)
	}
}

func (f *follower) waitFor(want stock, within time.Duration) error {
	deadline := time.After(within)
	for {
		f.mu.Lock()
		last := f.last
		f.mu.Unlock()
		if last == want {
			return nil
		}
		select {
		case <-f.got:
		case <-deadline:
			return fmt.Errorf("newest value %+v, want %+v", last, want)
		}
	}
}

func (f *follower) loop(ctx context.Context, once func(context.Context) error) {
	for ctx.Err() == nil {
		_ = once(ctx)
		if ctx.Err() != nil {
			return
		}
		f.reconnects.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func followWS(ctx context.Context, front, ip, sku string) *follower {
	f := newFollower("websocket", ip)
	vars := map[string]any{"s": []string{sku}}
	go f.loop(ctx, func(ctx context.Context) error {
		c, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(front, "http")+"/graphql", wsclient.Options{HTTPClient: clientFrom(ip)})
		if err != nil {
			return err
		}
		defer c.Close()
		sub, err := c.Subscribe(ctx, wsStockDoc, vars)
		if err != nil {
			return err
		}
		for m := range sub.C {
			var out struct {
				StockChanged stock `json:"stockChanged"`
			}
			if len(m.Errors) == 0 && json.Unmarshal(m.Data, &out) == nil {
				f.set(out.StockChanged)
			}
		}
		return c.Err()
	})
	return f
}

func followSSE(ctx context.Context, front, ip, sku string) *follower {
	f := newFollower("sse", ip)
	body := mustJSON(map[string]any{"query": wsStockDoc, "variables": map[string]any{"s": []string{sku}}})
	client := clientFrom(ip)
	go f.loop(ctx, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, front+"/graphql", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var out struct {
				Data struct {
					StockChanged stock `json:"stockChanged"`
				} `json:"data"`
			}
			if json.Unmarshal([]byte(data), &out) == nil && out.Data.StockChanged.Total > 0 {
				f.set(out.Data.StockChanged)
			}
		}
		return sc.Err()
	})
	return f
}

// prober reserves one unit of its SKU through nginx every 20 ms, each time
// as a new buyer, and records when reserves succeeded.
type prober struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	ok []time.Time
}

func startProber(s *system, sku string) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &prober{cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Timeout: 3 * time.Second}
	go func() {
		defer close(pr.done)
		for i := 0; ctx.Err() == nil; i++ {
			tok, err := s.Issuer.Mint(fmt.Sprintf("probe-%d", i), false, time.Hour)
			if err != nil {
				return
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			r := post(rctx, client, s.Front, tok, reserveMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "holdSeconds": 1}})
			rcancel()
			if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 && strings.Contains(string(r.Data), `"status":"HELD"`) {
				pr.mu.Lock()
				pr.ok = append(pr.ok, time.Now())
				pr.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return pr
}

func (pr *prober) stop() {
	pr.cancel()
	<-pr.done
}

// recovery returns how long reserves stopped succeeding around from (the
// primary's kill): the longest gap between successes that ends after from
// and begins within 10 s of it. A reserve answered while the primary was
// still dying ends a gap of a few milliseconds right after from, so the
// first gap after from is not the outage.
func (pr *prober) recovery(from time.Time) (bool, time.Duration) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	recovered, longest := false, time.Duration(0)
	prev := time.Time{}
	for _, at := range pr.ok {
		if at.After(from) && (prev.IsZero() || prev.Before(from.Add(10*time.Second))) {
			start := prev
			if start.IsZero() {
				start = from
			}
			recovered, longest = true, max(longest, at.Sub(start))
		}
		prev = at
	}
	return recovered, longest
}

// reserveVia reserves one unit as user through nginx and returns the token.
func (s *system) reserveVia(t *testing.T, sku, user string) string {
	t.Helper()
	var out struct {
		Reserve struct {
			Reservation struct {
				Token string `json:"token"`
			} `json:"reservation"`
			UserErrors []userError `json:"userErrors"`
		} `json:"reserve"`
	}
	s.mustGQL(&proc{URL: s.Front}, s.token(user, false), reserveMutation,
		map[string]any{"input": map[string]any{"sku": sku, "quantity": 1, "holdSeconds": 30}}, &out)
	require.Empty(t, out.Reserve.UserErrors)
	return out.Reserve.Reservation.Token
}

func (s *system) cancelVia(t *testing.T, token, user string) {
	t.Helper()
	s.mustGQL(&proc{URL: s.Front}, s.token(user, false), cancelMutation, map[string]any{"token": token}, nil)
}

// settledOrExplain is settled, naming on failure the ledger's HELD rows and
// what Redis has of each, the outbox's consumer group and consumers, and
// each row's movements and outbox entries.
func (s *system) settledOrExplain(t *testing.T, sku string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		st := s.stockOf(sku)
		if st.Held == 0 && s.scalar(`SELECT coalesce(sum(quantity), 0)::int FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx := context.Background()
	gen, _ := s.RDB.HGet(ctx, s.Keys.SKU(sku), "gen").Result()
	rows, err := s.Pool.Query(ctx, `SELECT token, quantity, expires_at, created_at FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku)
	require.NoError(t, err)
	var lines []string
	for rows.Next() {
		var tok string
		var q int
		var exp, created time.Time
		require.NoError(t, rows.Scan(&tok, &q, &exp, &created))
		h, _ := s.RDB.HGetAll(ctx, s.Keys.Hold(inventory.PartitionOf(sku), tok)).Result()
		lines = append(lines, fmt.Sprintf("%s q=%d created=%s exp=%s redis st=%q gen=%q", tok, q, created.Format("15:04:05.000"), exp.Format("15:04:05.000"), h["st"], h["gen"]))
	}
	p := inventory.PartitionOf(sku)
	var group []string
	if groups, err := s.RDB.XInfoGroups(ctx, s.Keys.Outbox(p)).Result(); err == nil {
		for _, g := range groups {
			group = append(group, fmt.Sprintf("group %s last-delivered %s pending %d lag %d", g.Name, g.LastDeliveredID, g.Pending, g.Lag))
			cs, _ := s.RDB.XInfoConsumers(ctx, s.Keys.Outbox(p), g.Name).Result()
			for _, c := range cs {
				group = append(group, fmt.Sprintf("  consumer %s pending %d idle %s", c.Name, c.Pending, c.Idle))
			}
		}
	}
	t.Fatalf("%s not at rest after %s (SKU gen %s, stock %+v); ledger HELD rows:\n%s\n%s%s", sku, within, gen, s.stockOf(sku),
		strings.Join(lines, "\n"), strings.Join(group, "\n"), s.explainHeld(sku, nil))
}
