package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

const (
	testSecret = "faults-test-secret-faults-test-secret!"
	keyPrefix  = "dl:"
)

// system is one Dropline deployment under test: a private redis-server, a
// fresh database, and any number of `dropline serve` processes. Dropline
// may reach Redis and Postgres through test-owned proxies (RedisVia,
// PostgresVia), so links can be cut while the test keeps direct clients.
type system struct {
	t      *testing.T
	Redis  *testenv.Server
	RDB    *redis.Client // direct, for checks and faults
	DBURL  string        // direct
	Pool   *pgxpool.Pool // direct, for checks
	Issuer *auth.Issuer
	Keys   inventory.Keys

	// RedisVia and PostgresVia are the addresses Dropline is given; they
	// default to the real ones.
	RedisVia    string
	PostgresVia string
	// Env adds variables to every process started afterwards (a variable
	// set here wins over the harness' own).
	Env map[string]string
	// Front, when set, is the base URL the drop's clients call instead of
	// the instances themselves: a reverse proxy in front of them.
	Front string

	mu    sync.Mutex
	procs []*proc
}

func newSystem(t *testing.T) *system {
	t.Helper()
	return newSystemOn(t, testenv.NewDatabase(t))
}

// newSystemOn is newSystem on the database at dbURL (e.g. an unmigrated
// one, which a `dropline migrate` of the test's choosing migrates).
func newSystemOn(t *testing.T, dbURL string) *system {
	t.Helper()
	srv := testenv.StartServer(t, "--maxmemory-policy", "noeviction")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
	t.Cleanup(func() { _ = rdb.Close() })
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	iss, err := auth.NewIssuer([]byte(testSecret))
	require.NoError(t, err)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	s := &system{
		t: t, Redis: srv, RDB: rdb, DBURL: dbURL, Pool: pool, Issuer: iss, Keys: inventory.NewKeys(keyPrefix),
		RedisVia: srv.Addr, PostgresVia: u.Host, Env: map[string]string{},
	}
	t.Cleanup(s.stopAll)
	return s
}

// databaseURL is the URL Dropline is given: the test database through PostgresVia.
func (s *system) databaseURL() string {
	u, _ := url.Parse(s.DBURL)
	u.Host = s.PostgresVia
	return u.String()
}

// proc is one `dropline serve` process.
type proc struct {
	Name string
	URL  string
	cmd  *exec.Cmd
	log  *testenv.LogBuffer
	done chan struct{}
}

// environ is the environment of a `dropline` process of this system.
func (s *system) environ() []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.TempDir(),
		"REDIS_URL=redis://" + s.RedisVia + "/0",
		"DATABASE_URL=" + s.databaseURL(),
		"DROPLINE_ADDR=127.0.0.1:0",
		"DROPLINE_JWT_SECRET=" + testSecret,
		"DROPLINE_KEY_PREFIX=" + keyPrefix,
		"DROPLINE_LOG_FORMAT=json",
		"DROPLINE_SHUTDOWN_TIMEOUT=5s",
		"GORACE=halt_on_error=0",
	}
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// start runs `dropline serve` on a free port and waits for /readyz.
func (s *system) start(name string) *proc {
	s.t.Helper()
	return s.startBinary(name, binary)
}

// startBinary is start with the dropline binary at bin (e.g. an earlier
// release's).
func (s *system) startBinary(name, bin string) *proc {
	s.t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = s.environ()
	stderr, err := cmd.StderrPipe()
	require.NoError(s.t, err)
	p := &proc{Name: name, cmd: cmd, log: &testenv.LogBuffer{}, done: make(chan struct{})}
	require.NoError(s.t, cmd.Start())
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.log.Write([]byte(line + "\n"))
			if strings.Contains(line, "dropline is serving") {
				var m struct {
					Addr string `json:"addr"`
				}
				if json.Unmarshal([]byte(line), &m) == nil && m.Addr != "" {
					select {
					case addr <- m.Addr:
					default:
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.done)
	}()
	select {
	case a := <-addr:
		p.URL = "http://" + a
	case <-p.done:
		s.t.Fatalf("dropline %s exited at start:\n%s", name, p.log.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		s.t.Fatalf("dropline %s did not report its address:\n%s", name, p.log.String())
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	s.waitReady(p, 30*time.Second)
	return p
}

// waitReady polls /readyz until it answers 200.
func (s *system) waitReady(p *proc, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			s.t.Fatalf("dropline %s exited:\n%s", p.Name, p.log.String())
		default:
		}
		resp, err := quickClient.Get(p.URL + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("dropline %s not ready after %s: %s", p.Name, within, last)
}

var quickClient = &http.Client{Timeout: 5 * time.Second}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("dropline %s survived SIGKILL", p.Name)
	}
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stopAll stops every process gracefully (SIGTERM, then SIGKILL) and fails
// the test when a log mentions a panic or a data race.
func (s *system) stopAll() {
	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	for _, p := range procs {
		if !p.alive() {
			continue
		}
		p.signal(syscall.SIGCONT)
		p.signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.signal(syscall.SIGKILL)
			<-p.done
		}
	}
	for _, p := range procs {
		log := p.log.String()
		if bad := badLogLines(log); len(bad) > 0 {
			s.t.Errorf("dropline %s logged %d bad line(s), first: %s", p.Name, len(bad), bad[0])
			for _, r := range crashReports(log) {
				s.t.Logf("dropline %s reported:\n%s", p.Name, r)
			}
		}
		if s.t.Failed() && os.Getenv("FAULTS_SHOW_LOGS") != "" {
			s.t.Logf("log of %s:\n%s", p.Name, log)
		}
	}
}

// badLogLines returns lines that mention a panic or a data race.
func badLogLines(log string) []string {
	var bad []string
	for _, line := range strings.Split(log, "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "panic") || strings.Contains(l, "data race") {
			bad = append(bad, line)
		}
	}
	return bad
}

// crashReports returns, whole, each data race report in a log (from its
// WARNING line to the line of '=' that ends it) and the first panic with
// the stacks after it: the first bad line alone does not say where to look,
// and a race that shows up once in many runs may not show up again.
func crashReports(log string) []string {
	var out []string
	lines := strings.Split(log, "\n")
	for i := 0; i < len(lines); i++ {
		switch {
		case strings.HasPrefix(lines[i], "WARNING: DATA RACE"):
			end := i + 1
			for end < len(lines) && !strings.HasPrefix(lines[end], "==================") {
				end++
			}
			out = append(out, strings.Join(lines[i:end], "\n"))
			i = end
		case strings.HasPrefix(lines[i], "panic: "):
			end := min(i+maxPanicLines, len(lines))
			return append(out, strings.Join(lines[i:end], "\n"))
		}
	}
	return out
}

// maxPanicLines bounds the panic crashReports shows: its goroutines' stacks.
const maxPanicLines = 400

// live returns the processes still running.
func (s *system) live() []*proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*proc
	for _, p := range s.procs {
		if p.alive() {
			out = append(out, p)
		}
	}
	return out
}

func (s *system) token(user string, admin bool) string {
	tok, err := s.Issuer.Mint(user, admin, 2*time.Hour)
	require.NoError(s.t, err)
	return tok
}

// gqlResult is a GraphQL response, or why there was none.
type gqlResult struct {
	Status int
	Data   json.RawMessage `json:"data"`
	Errors []gqlError      `json:"errors"`
	Err    error           // transport failure
}

type gqlError struct {
	Message    string         `json:"message"`
	Extensions map[string]any `json:"extensions"`
}

func (e gqlError) code() string { c, _ := e.Extensions["code"].(string); return c }

// post sends one GraphQL operation; it never fails the test, so load
// goroutines can classify outcomes themselves.
func post(ctx context.Context, client *http.Client, base, token, query string, vars map[string]any) gqlResult {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return gqlResult{Err: err}
	}
	return postRaw(ctx, client, base, token, "application/json", body)
}

func postRaw(ctx context.Context, client *http.Client, base, token, contentType string, body []byte) gqlResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/graphql", bytes.NewReader(body))
	if err != nil {
		return gqlResult{Err: err}
	}
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return gqlResult{Err: err}
	}
	defer resp.Body.Close()
	r := gqlResult{Status: resp.StatusCode}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.Err = err
		return r
	}
	if err := json.Unmarshal(b, &r); err != nil {
		r.Err = fmt.Errorf("status %d, undecodable body %.200q: %w", resp.StatusCode, b, err)
	}
	return r
}

// mustGQL posts and requires a 200 without top-level errors.
func (s *system) mustGQL(p *proc, token, query string, vars map[string]any, out any) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r := post(ctx, quickClient, p.URL, token, query, vars)
	require.NoError(s.t, r.Err)
	require.Equal(s.t, http.StatusOK, r.Status)
	require.Empty(s.t, r.Errors)
	if out != nil {
		require.NoError(s.t, json.Unmarshal(r.Data, out))
	}
}

type userError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type stock struct {
	Available int `json:"available"`
	Held      int `json:"held"`
	Sold      int `json:"sold"`
	Total     int `json:"total"`
}

// createProduct creates sku with units of stock over GraphQL, as an admin.
func (s *system) createProduct(p *proc, sku string, units, maxPerUser int) {
	s.t.Helper()
	input := map[string]any{"sku": sku, "name": "Fault " + sku, "price": map[string]any{"amount": 999, "currency": "EUR"}, "stock": units}
	if maxPerUser > 0 {
		input["maxPerUser"] = maxPerUser
	}
	var out struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	s.mustGQL(p, s.token("ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": input}, &out)
	require.Empty(s.t, out.CreateProduct.UserErrors)
}

// stockOf reads the live counters over GraphQL, retrying while the service
// recovers.
func (s *system) stockOf(sku string) stock {
	s.t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range s.live() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r := post(ctx, quickClient, p.URL, "", `query($sku: ID!) { product(sku: $sku) { stock { available held sold total } } }`,
				map[string]any{"sku": sku})
			cancel()
			if r.Err == nil && r.Status == http.StatusOK && len(r.Errors) == 0 {
				var out struct {
					Product *struct {
						Stock stock `json:"stock"`
					} `json:"product"`
				}
				if json.Unmarshal(r.Data, &out) == nil && out.Product != nil {
					return out.Product.Stock
				}
			}
			last = fmt.Sprintf("%d %v %v %s", r.Status, r.Err, r.Errors, r.Data)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("stock of %s unreadable: %s", sku, last)
	return stock{}
}

// redisStock reads the SKU's counters straight from Redis; ok is false
// when Redis does not have the SKU (flushed and not rebuilt yet) or is down.
func (s *system) redisStock(ctx context.Context, sku string) (st stock, ok bool) {
	vals, err := s.RDB.HMGet(ctx, s.Keys.SKU(sku), "total", "avail", "held", "sold").Result()
	if err != nil || vals[0] == nil {
		return stock{}, false
	}
	n := func(v any) int {
		var x int
		str, _ := v.(string)
		_, _ = fmt.Sscan(str, &x)
		return x
	}
	return stock{Total: n(vals[0]), Available: n(vals[1]), Held: n(vals[2]), Sold: n(vals[3])}, true
}

func (s *system) scalar(query string, args ...any) int {
	s.t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(s.t, s.Pool.QueryRow(ctx, query, args...).Scan(&n), query)
	return n
}

// eventually polls cond every 50 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %s", what, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCrashReportsAreShownWhole: what a failing server's log shows of a data
// race or a panic is the whole report, each race on its own, and nothing
// of the ordinary lines around them.
func TestCrashReportsAreShownWhole(t *testing.T) {
	t.Parallel()
	race := func(n int) string {
		return fmt.Sprintf("WARNING: DATA RACE\nWrite at 0x%d by goroutine 7:\n  main.f()\n      /src/f.go:%d +0x2b", n, n)
	}
	log := strings.Join([]string{
		`{"level":"info","message":"dropline is serving"}`,
		"==================", race(1), "==================",
		`{"level":"info","message":"request"}`,
		"==================", race(2), "==================",
		"panic: boom", "", "goroutine 1 [running]:", "main.main()",
	}, "\n")
	require.Equal(t, []string{race(1), race(2), "panic: boom\n\ngoroutine 1 [running]:\nmain.main()"}, crashReports(log))
	require.Empty(t, crashReports(`{"level":"info","message":"request"}`))
}
