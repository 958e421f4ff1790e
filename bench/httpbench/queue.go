package httpbench

import (
	"context"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // Redis names scripts by SHA-1
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/loopback"
	"github.com/dropline/dropline/internal/machine"
	"github.com/dropline/dropline/lua"
)

// QueueConfig is one run of the admission queue's benchmark (RunQueue).
type QueueConfig struct {
	Binary      string
	DatabaseURL string
	// Tickets is how many principals join the queue (default 50,000).
	Tickets int
	// Connections is wrk's concurrency (default 50).
	Connections int
	// Step is the length of each polling step (default 10 s).
	Step time.Duration
	// Waiters is how many websocket clients watch queueChanged (0: none).
	Waiters int
	// Env is added to the server's environment.
	Env      []string
	Progress io.Writer
}

func (c *QueueConfig) defaults() {
	if c.Tickets == 0 {
		c.Tickets = 50_000
	}
	if c.Connections == 0 {
		c.Connections = 50
	}
	if c.Step == 0 {
		c.Step = 10 * time.Second
	}
}

func (c QueueConfig) logf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
	}
}

// QueueResult is what RunQueue measured.
type QueueResult struct {
	Started         time.Time
	Load, LoadAfter string
	Config          QueueConfig
	// Joins is wrk's run of the principals' joins, each in turn, ended once
	// the queue has Tickets tickets (a principal answered twice near the
	// end has its ticket again).
	Joins    WrkResult
	Joined   int64   // tickets the queue holds after the run
	JoinRate float64 // joins per second over the run
	// JoinServerCPU and JoinRedisCPU are per join.
	JoinServerCPU, JoinRedisCPU time.Duration
	// RedisBytesPerTicket is MEMORY USAGE of the queue's keys over its
	// tickets; UsedMemoryPerTicket the growth of used_memory over the joins.
	RedisBytesPerTicket, UsedMemoryPerTicket float64
	// LongestScript is the slowest script call Redis's slowlog saw over the
	// whole run (0: none slower than SlowlogFloor), and LongestScriptName its
	// command and first arguments; LongestQueueScript the slowest of the
	// queue's own scripts (lua.Queue).
	LongestScript, LongestQueueScript         time.Duration
	LongestScriptName, LongestQueueScriptName string
	SlowlogFloor                              time.Duration
	// PollTicket polls myQueueTicket as waiting principals; PollStock asks
	// the product's stock, the same principals, connections and length.
	PollTicket, PollStock WrkResult
	PollTicketServerCPU   time.Duration // per poll
	PollStockServerCPU    time.Duration // per query
	// Waiters' figures, when Waiters > 0.
	Waiter WaiterResult
}

// Ratio is myQueueTicket's rate over the stock query's.
func (r QueueResult) Ratio() float64 {
	s := r.PollStock.PerSecond(r.PollStock.Requests)
	if s == 0 {
		return 0
	}
	return r.PollTicket.PerSecond(r.PollTicket.Requests) / s
}

// queueSKU is the queued product the run creates, admitting queueRate a
// minute: a step every 250 ms admits 2 or 3, so the waiters see about four
// steps a second while nearly every ticket keeps waiting.
const (
	queueSKU  = "BENCH-Q"
	queueRate = 600
)

// queueWrkScript walks the principals' tokens in turn (each thread its own
// slice), round and round. A response containing BENCH_OK counts as ok. done() prints one JSON line in
// wrkScript's shape (ok as held).
const queueWrkScript = `
local tokens = {}
for line in io.lines(os.getenv("BENCH_TOKENS")) do tokens[#tokens + 1] = line end
local body = io.open(os.getenv("BENCH_BODY")):read("*a")
local okpat = os.getenv("BENCH_OK")
local threads = {}
local nthreads = tonumber(os.getenv("BENCH_THREADS"))

function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end

local reqs, i, first, last = {}, 0, 0, 0
held, other, failed = 0, 0, 0

function init(args)
  local n = #tokens
  first = math.floor(offset * n / nthreads) + 1
  last = math.floor((offset + 1) * n / nthreads)
  for k = first, last do
    reqs[k] = wrk.format("POST", "/graphql", {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. tokens[k],
    }, body)
  end
  i = first - 1
end

function request()
  i = i + 1
  if i > last then i = first end
  return reqs[i]
end

function response(status, headers, b)
  if status ~= 200 then
    failed = failed + 1
  elseif b:find(okpat, 1, true) then
    held = held + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local h, x, f = 0, 0, 0
  for _, t in ipairs(threads) do
    h = h + t:get("held"); x = x + t:get("other"); f = f + t:get("failed")
  end
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"errors_connect":%d,"errors_read":%d,"errors_write":%d,"errors_status":%d,"errors_timeout":%d,' ..
    '"held":%d,"out_of_stock":0,"rate_limited":0,"other":%d,"failed":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, h, x, f,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
`

// queueWrk is one wrk run of queueWrkScript.
type queueWrk struct {
	dir, base, tokensFile, name, body, ok string
	connections                           int
	duration                              time.Duration
	// until, when set, is polled every 5 ms: true ends the run.
	until func() bool
}

func (r queueWrk) run(ctx context.Context) (WrkResult, error) {
	var res WrkResult
	path, err := exec.LookPath("wrk")
	if err != nil {
		return res, fmt.Errorf("wrk is not installed (apt-get install wrk): %w", err)
	}
	script := filepath.Join(r.dir, "queue.lua")
	if err := os.WriteFile(script, []byte(queueWrkScript), 0o600); err != nil {
		return res, err
	}
	body := filepath.Join(r.dir, "body-"+r.name+".json")
	if err := os.WriteFile(body, []byte(r.body), 0o600); err != nil {
		return res, err
	}
	secs := max(int(r.duration.Round(time.Second)/time.Second), 1)
	cctx, cancel := context.WithTimeout(ctx, r.duration+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, path, "-t", "1", "-c", strconv.Itoa(r.connections), //nolint:gosec // our own arguments
		"-d", strconv.Itoa(secs)+"s", "--timeout", "5s", "-s", script, r.base+"/graphql")
	cmd.Env = append(os.Environ(), "BENCH_TOKENS="+r.tokensFile, "BENCH_BODY="+body, "BENCH_THREADS=1",
		"BENCH_OK="+r.ok)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("wrk: %w", err)
	}
	// wrk runs its whole duration even when every thread stopped: once the
	// work is done, SIGINT makes it stop and print its summary.
	finished := make(chan struct{})
	if r.until != nil {
		go func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-finished:
					return
				case <-tick.C:
					if r.until() {
						_ = cmd.Process.Signal(os.Interrupt)
						return
					}
				}
			}
		}()
	}
	err = cmd.Wait()
	close(finished)
	out := stdout.String()
	if err != nil {
		return res, fmt.Errorf("wrk: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "BENCHJSON "); ok {
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				return res, fmt.Errorf("wrk summary %q: %w", rest, err)
			}
			res.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			return res, nil
		}
	}
	return res, fmt.Errorf("wrk printed no summary: %s", out)
}

func gqlBody(query string, vars map[string]any) string {
	b, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	return string(b)
}

// RunQueue measures the admission queue black-box against the real binary
// (its own redis-server and database): Tickets principals join one queued
// product through wrk, each once; Redis's memory per ticket and its slowest
// script are read; then myQueueTicket is polled by the waiting principals
// and, for comparison in the same run, the product's stock is queried by
// the same principals over the same connections; with Waiters, that many
// websocket clients watch queueChanged (RunWaiters).
func RunQueue(ctx context.Context, cfg QueueConfig) (res QueueResult, err error) {
	cfg.defaults()
	res = QueueResult{Started: time.Now().UTC(), Load: machine.LoadAverage(), Config: cfg}
	defer func() { res.LoadAfter = machine.LoadAverage() }()
	dir, err := os.MkdirTemp("", "dropline-bench-queue-")
	if err != nil {
		return res, err
	}
	if os.Getenv("BENCH_KEEP") == "" {
		defer os.RemoveAll(dir)
	} else {
		cfg.logf("keeping %s", dir)
	}
	redisProc, redisAddr, err := startRedis(ctx, dir)
	if err != nil {
		return res, err
	}
	defer redisProc.stop(5 * time.Second)
	dbURL, drop, err := createDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer drop()
	port, err := loopback.FreePort()
	if err != nil {
		return res, err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	secretHex := hex.EncodeToString(secret)
	logFile, err := os.Create(filepath.Join(dir, "dropline.log"))
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	env := append([]string{
		"REDIS_URL=redis://" + redisAddr + "/0",
		"DATABASE_URL=" + dbURL,
		"DROPLINE_ADDR=127.0.0.1:" + strconv.Itoa(port),
		"DROPLINE_JWT_SECRET=" + secretHex,
		// The run's principals join and poll far faster than a person: the
		// per-principal budget would measure itself.
		"DROPLINE_MUTATION_RATE=-1",
		// The waiters come from a few loopback addresses.
		"DROPLINE_STREAM_CONNS_PER_IP=" + strconv.Itoa(max(256, cfg.Waiters)),
	}, cfg.Env...)
	server, err := startServer(ctx, cfg.Binary, env, logFile, base)
	if err != nil {
		return res, err
	}
	defer server.stop(20 * time.Second)
	cfg.logf("dropline serve on %s, redis-server on %s", base, redisAddr)

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	// Every script call slower than the floor is logged.
	res.SlowlogFloor = time.Millisecond
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "1000"}, {"slowlog-max-len", "4096"}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			return res, err
		}
	}
	_ = rdb.Do(ctx, "SLOWLOG", "RESET").Err()

	iss, err := auth.NewIssuer([]byte(secretHex))
	if err != nil {
		return res, err
	}
	api := apiClient{base: base, client: &http.Client{Timeout: 10 * time.Second}}
	if api.admin, err = iss.Mint("bench-admin", true, 4*time.Hour); err != nil {
		return res, err
	}
	if err := api.createQueuedProduct(ctx, queueSKU, 1_000_000_000, queueRate); err != nil {
		return res, err
	}
	tokens, tokensFile, err := mintBuyers(iss, dir, "waiter", cfg.Tickets)
	if err != nil {
		return res, err
	}

	// Joins: every principal once.
	mem0, _ := usedMemory(ctx, rdb)
	cfg.logf("%d joins, wrk -c %d ...", cfg.Tickets, cfg.Connections)
	join := queueWrk{dir: dir, base: base, tokensFile: tokensFile, name: "join", connections: cfg.Connections,
		body: gqlBody(`mutation Join($i: JoinQueueInput!) { joinQueue(input: $i) { ticket { number position status } userErrors { code } } }`,
			map[string]any{"i": map[string]any{"sku": queueSKU}}),
		ok: `"number":`, duration: 10 * time.Minute}
	whoKey, last, moved := "", int64(-1), time.Now()
	join.until = func() bool {
		if whoKey == "" {
			k, _ := rdb.Keys(ctx, "*:qwho:sku:"+queueSKU).Result()
			if len(k) == 0 {
				return time.Since(moved) > 10*time.Second
			}
			whoKey = k[0]
		}
		n, _ := rdb.HLen(ctx, whoKey).Result()
		if n != last {
			last, moved = n, time.Now()
		}
		// Done, or stuck (the summary says why).
		return n >= int64(cfg.Tickets) || time.Since(moved) > 10*time.Second
	}
	cpu0, rcpu0 := server.cpuTime(), redisProc.cpuTime()
	if res.Joins, err = join.run(ctx); err != nil {
		return res, err
	}
	if n := res.Joins.Held; n > 0 {
		res.JoinServerCPU = (server.cpuTime() - cpu0) / time.Duration(n)
		res.JoinRedisCPU = (redisProc.cpuTime() - rcpu0) / time.Duration(n)
	}
	res.JoinRate = 0
	mem1, _ := usedMemory(ctx, rdb)
	keys, err := rdb.Keys(ctx, "*:sku:"+queueSKU).Result()
	if err != nil {
		return res, err
	}
	var bytes int64
	for _, k := range keys {
		if !strings.Contains(k, ":q") {
			continue
		}
		n, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return res, err
		}
		bytes += n
		if strings.Contains(k, ":qwho:") {
			res.Joined, _ = rdb.HLen(ctx, k).Result()
		}
	}
	res.JoinRate = res.Joins.PerSecond(res.Joined)
	if res.Joined > 0 {
		res.RedisBytesPerTicket = float64(bytes) / float64(res.Joined)
		res.UsedMemoryPerTicket = float64(mem1-mem0) / float64(res.Joined)
	}
	cfg.logf("joins: %.0f/s (%d of %d joined, %d other, %d failed); %.0f B of Redis per ticket",
		res.JoinRate, res.Joins.Held, cfg.Tickets, res.Joins.Other, res.Joins.Failed, res.RedisBytesPerTicket)

	// Polls: myQueueTicket, then the stock, the same principals.
	poll := queueWrk{dir: dir, base: base, tokensFile: tokensFile, connections: cfg.Connections, duration: cfg.Step}
	poll.name, poll.ok = "ticket", `"status":"WAITING"`
	poll.body = gqlBody(`query Ticket($s: ID) { myQueueTicket(sku: $s) { number position etaSeconds status pollAfterSeconds } }`,
		map[string]any{"s": queueSKU})
	warm := poll
	warm.duration = 2 * time.Second
	if _, err := warm.run(ctx); err != nil {
		return res, err
	}
	cfg.logf("myQueueTicket polls, wrk -c %d, %s ...", cfg.Connections, cfg.Step)
	cpu0 = server.cpuTime()
	if res.PollTicket, err = poll.run(ctx); err != nil {
		return res, err
	}
	if n := res.PollTicket.Requests; n > 0 {
		res.PollTicketServerCPU = (server.cpuTime() - cpu0) / time.Duration(n)
	}
	poll.name, poll.ok = "stock", `"available":`
	poll.body = gqlBody(`query Stock($s: ID!) { product(sku: $s) { stock { available held sold } } }`, map[string]any{"s": queueSKU})
	cfg.logf("stock queries, wrk -c %d, %s ...", cfg.Connections, cfg.Step)
	cpu0 = server.cpuTime()
	if res.PollStock, err = poll.run(ctx); err != nil {
		return res, err
	}
	if n := res.PollStock.Requests; n > 0 {
		res.PollStockServerCPU = (server.cpuTime() - cpu0) / time.Duration(n)
	}
	cfg.logf("myQueueTicket %.0f/s, stock %.0f/s: %.2fx", res.PollTicket.PerSecond(res.PollTicket.Requests),
		res.PollStock.PerSecond(res.PollStock.Requests), res.Ratio())

	if cfg.Waiters > 0 {
		cfg.logf("%d websocket waiters on queueChanged ...", cfg.Waiters)
		if res.Waiter, err = runWaiters(ctx, cfg, base, rdb, server, tokens); err != nil {
			return res, err
		}
	}

	res.LongestScript, res.LongestScriptName, err = longestScript(ctx, rdb, nil)
	if err != nil {
		return res, err
	}
	res.LongestQueueScript, res.LongestQueueScriptName, err = longestScript(ctx, rdb, queueScripts())
	return res, err
}

func (a apiClient) createQueuedProduct(ctx context.Context, sku string, stock, perMinute int) error {
	var out struct {
		CreateProduct struct {
			UserErrors []struct{ Code, Message string } `json:"userErrors"`
		} `json:"createProduct"`
	}
	err := a.do(ctx, `mutation($i: CreateProductInput!) { createProduct(input: $i) { userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"sku": sku, "name": sku, "price": map[string]any{"amount": 1000, "currency": "EUR"},
			"stock": stock, "queue": map[string]any{"opensAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano),
				"admitPerMinute": perMinute}}}, &out)
	if err != nil {
		return fmt.Errorf("creating %s: %w", sku, err)
	}
	if ue := out.CreateProduct.UserErrors; len(ue) > 0 {
		return fmt.Errorf("creating %s: %s %s", sku, ue[0].Code, ue[0].Message)
	}
	return nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO")
}

// queueScripts names the SHA-1 of the queue's scripts.
func queueScripts() map[string]string {
	out := map[string]string{}
	for _, name := range lua.Queue {
		out[fmt.Sprintf("%x", sha1.Sum([]byte(lua.MustSource(name))))] = name //nolint:gosec // Redis names scripts by SHA-1
	}
	return out
}

// longestScript reads Redis's slowlog for its slowest script call, of the
// scripts only when only is not nil.
func longestScript(ctx context.Context, rdb *redis.Client, only map[string]string) (time.Duration, string, error) {
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return 0, "", err
	}
	var longest time.Duration
	name := ""
	for _, l := range logs {
		if len(l.Args) == 0 {
			continue
		}
		cmd := strings.ToLower(l.Args[0])
		if !slices.Contains([]string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"}, cmd) {
			continue
		}
		if only != nil && (len(l.Args) < 2 || only[strings.ToLower(l.Args[1])] == "") {
			continue
		}
		if l.Duration > longest {
			longest = l.Duration
			name = strings.Join(l.Args[:min(len(l.Args), 4)], " ")
			if len(l.Args) > 1 && only != nil {
				name = only[strings.ToLower(l.Args[1])]
			}
		}
	}
	return longest, name, nil
}
