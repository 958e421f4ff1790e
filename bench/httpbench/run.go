package httpbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/loopback"
	"github.com/dropline/dropline/internal/machine"
)

// Config says what to run and for how long.
type Config struct {
	// Binary is the dropline binary to start (bin/dropline).
	Binary string
	// DatabaseURL names the PostgreSQL server (a loopback one); the run
	// creates and drops its own database there.
	DatabaseURL string
	// Connections is wrk's and the baselines' concurrency (50).
	Connections int
	// Buyers rotate through the successful reserves (3,000).
	Buyers int
	// StormBuyers ask for the sold-out SKU (10,000).
	StormBuyers int
	// Step is the length of each measured step (10s).
	Step time.Duration
	// Peak is the sustained peak the write-behind is watched over (60s).
	Peak time.Duration
	// Env is added to the server's environment (e.g. DROPLINE_ADMIN_ADDR).
	Env []string
	// Progress receives one line per step; nil for none.
	Progress io.Writer
	// ReserveOnly stops after the reserve step and the bare script's
	// (and the floor's, when Floor is set): for comparing two builds quickly
	// (their CPU per operation is the figure to read under load).
	ReserveOnly bool
	// ReserveAndStorm runs the reserve step and the sold-out storm only:
	// the baselines, the paced step and the peak are skipped (to compare
	// builds on the storm's CPU per answer and its ratio).
	ReserveAndStorm bool
	// Profile, when set, is where a CPU profile of the server over the
	// reserve step is written (taken through its admin listener); the
	// storm step's is written beside it, ".storm" added to its name.
	Profile string
	// Floor is the bench-floor binary (cmd/bench-floor); when set, its
	// HTTP floor is driven right after the reserve step by the same wrk
	// script, and its CPU per request is what Dropline's is divided by;
	// its bare net/http handler is driven likewise right after the storm.
	Floor string
}

// Result is everything one run measured.
type Result struct {
	Started  time.Time
	Load     string // the load average when the run began
	Reserve  WrkResult
	Redis    Baseline
	Postgres Baseline
	Storm    WrkResult
	// StormCPU, StormRedisCPU and StormLoadCPU are the CPU time dropline,
	// redis-server and wrk used per answer over the storm step.
	StormCPU, StormRedisCPU, StormLoadCPU time.Duration
	// Floor is the floor server (net/http + gqlgen, reserve returning a
	// fixed reservation) driven like Reserve; FloorCPU its CPU time per
	// request.
	Floor    WrkResult
	FloorCPU time.Duration
	// Bare is the bare net/http handler (bench/floor.BareHandler: the
	// sold-out answer's bytes and headers, nothing parsed) driven like
	// Storm; BareCPU its CPU time per request.
	Bare    WrkResult
	BareCPU time.Duration
	// RedisBareCPU is redis-server's CPU time per call of the bare
	// reserve-shaped script over the EVALSHA baseline.
	RedisBareCPU time.Duration
	// Steady is wrk paced at 80 % of Reserve's successful rate.
	Steady     WrkResult
	SteadyRate float64
	Peak       PeakResult
	// ServerCPU and RedisCPU are the CPU time dropline and redis-server used
	// per successful reserve over the reserve step: a cost that holds still
	// when other work shares the machine, unlike the throughput.
	ServerCPU, RedisCPU time.Duration
	// PostgresCPU is what the database's backends used per successful
	// reserve over the reserve step (the write-behind, mostly), and LoadCPU
	// what wrk used: with ServerCPU and RedisCPU, the machine's whole cost
	// of a hold.
	PostgresCPU, LoadCPU time.Duration
	// StockFell is how many units the server's stock lost over the reserve
	// step: wrk's held count plus the requests still in flight when it
	// stopped (at most one per connection).
	StockFell int64
	Config    Config
}

// PeakResult is the sustained peak with the write-behind sampled.
type PeakResult struct {
	Reserve     WrkResult
	EventRate   float64 // successful reserves per second (one outbox event each)
	AppliedRate float64 // events applied to the ledger per second during the peak
	// Capacity is events applied per second of flusher busy time (the sum
	// of its batch durations and of its checks that batches committed
	// unflushed are durable): the rate it could sustain if it never waited.
	Capacity float64
	// BatchMean is the events per batch over the peak, and BusyShare the
	// share of the peak's wall time the flusher spent in batches. Its
	// reads from Redis are outside the batches: a flusher whose batches are
	// full and whose busy share is well below 1 spends the rest reading, so
	// Capacity is then more than it could sustain.
	BatchMean, BusyShare float64
	// PostgresCPU is the database's backends' CPU time per applied event.
	PostgresCPU time.Duration
	LagP50      float64
	LagP99      float64
	LagMax      float64
	BacklogMax  float64
	Samples     int
	// DrainSeconds is how long after the peak the backlog took to reach 0.
	DrainSeconds float64
}

func (c *Config) defaults() {
	if c.Connections == 0 {
		c.Connections = 50
	}
	if c.Buyers == 0 {
		c.Buyers = 3000
	}
	if c.StormBuyers == 0 {
		c.StormBuyers = 10000
	}
	if c.Step == 0 {
		c.Step = 10 * time.Second
	}
	if c.Peak == 0 {
		c.Peak = 60 * time.Second
	}
}

func (c Config) logf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
	}
}

// Run performs one whole benchmark (see the package doc).
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	cfg.defaults()
	res = Result{Started: time.Now().UTC(), Load: machine.LoadAverage(), Config: cfg}
	dir, err := os.MkdirTemp("", "dropline-bench-http-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)

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
	var adminBase string
	if cfg.Profile != "" {
		ap, err := loopback.FreePort()
		if err != nil {
			return res, err
		}
		adminBase = "http://127.0.0.1:" + strconv.Itoa(ap)
		cfg.Env = append(cfg.Env, "DROPLINE_ADMIN_ADDR=127.0.0.1:"+strconv.Itoa(ap))
	}
	env := append([]string{
		"REDIS_URL=redis://" + redisAddr + "/0",
		"DATABASE_URL=" + dbURL,
		"DROPLINE_ADDR=127.0.0.1:" + strconv.Itoa(port),
		"DROPLINE_JWT_SECRET=" + secretHex,
	}, cfg.Env...)
	server, err := startServer(ctx, cfg.Binary, env, logFile, base)
	if err != nil {
		return res, err
	}
	defer server.stop(20 * time.Second)
	cfg.logf("dropline serve on %s, redis-server on %s, database %s", base, redisAddr, dbURL)

	iss, err := auth.NewIssuer([]byte(secretHex))
	if err != nil {
		return res, err
	}
	api := apiClient{base: base, client: &http.Client{Timeout: 10 * time.Second}}
	if api.admin, err = iss.Mint("bench-admin", true, 4*time.Hour); err != nil {
		return res, err
	}
	const hot, soldOut = "BENCH-HOT", "BENCH-SOLD-OUT"
	if err := api.createProduct(ctx, hot, 1_000_000_000); err != nil {
		return res, err
	}
	if err := api.createProduct(ctx, soldOut, 0); err != nil {
		return res, err
	}
	_, buyersFile, err := mintBuyers(iss, dir, "buyer", cfg.Buyers)
	if err != nil {
		return res, err
	}
	_, stormFile, err := mintBuyers(iss, dir, "storm", cfg.StormBuyers)
	if err != nil {
		return res, err
	}
	// One wrk thread drives all the connections: on two cores its single
	// event loop takes 11-12 µs of CPU per request against 14 for two
	// threads, CPU the server under test would otherwise lose to the driver.
	w := wrkRun{dir: dir, base: base, tokensFile: buyersFile, sku: hot, connections: cfg.Connections, threads: 1}

	// Warm up: connections, script cache, the Go runtime's heap.
	w.duration = 3 * time.Second
	if _, err := w.run(ctx); err != nil {
		return res, err
	}
	if err := waitDrained(ctx, api.client, base, 30*time.Second); err != nil {
		return res, err
	}

	cfg.logf("reserve over GraphQL, wrk -c %d, %s ...", cfg.Connections, cfg.Step)
	before, err := api.available(ctx, hot)
	if err != nil {
		return res, err
	}
	w.duration = cfg.Step
	profiled := make(chan error, 1)
	if adminBase != "" {
		go func() { profiled <- takeProfile(ctx, adminBase, cfg.Step-time.Second, cfg.Profile) }()
	} else {
		profiled <- nil
	}
	rs0, _ := readRedisStats(ctx, redisAddr)
	cpu0, rcpu0, pg0 := server.cpuTime(), redisProc.cpuTime(), backends(ctx, dbURL)
	if res.Reserve, err = w.run(ctx); err != nil {
		return res, err
	}
	rcpu1 := redisProc.cpuTime()
	rs1, _ := readRedisStats(ctx, redisAddr)
	if n := res.Reserve.Held; n > 0 {
		res.ServerCPU = (server.cpuTime() - cpu0) / time.Duration(n)
		res.RedisCPU = (rcpu1 - rcpu0) / time.Duration(n)
		res.PostgresCPU = machine.CPUSince(pg0, backends(ctx, dbURL)) / time.Duration(n)
		res.LoadCPU = res.Reserve.CPU / time.Duration(n)
	}
	if err := <-profiled; err != nil {
		return res, err
	}
	after, err := api.available(ctx, hot)
	if err != nil {
		return res, err
	}
	res.StockFell = before - after
	cfg.logf("  %.0f holds/s (%d of %d requests), p50 %.2f ms p99 %.2f ms; stock fell by %d; CPU per hold: dropline %s, redis-server %s, postgres %s, wrk %s",
		res.Reserve.PerSecond(res.Reserve.Held), res.Reserve.Held, res.Reserve.Requests,
		ms(res.Reserve.P50US), ms(res.Reserve.P99US), before-after, res.ServerCPU, res.RedisCPU, res.PostgresCPU, res.LoadCPU)
	cfg.logf("  redis-server per hold (INFO commandstats and stats):\n%s", perOp(rs0, rs1, res.Reserve.Held))
	if cfg.Floor != "" {
		cfg.logf("floor server (net/http + gqlgen, fixed reservation), wrk -c %d, %s ...", cfg.Connections, cfg.Step)
		if res.Floor, res.FloorCPU, err = floorRun(ctx, cfg, "http", w, func(r WrkResult) int64 { return r.Held }); err != nil {
			return res, err
		}
		cfg.logf("  %.0f requests/s, p50 %.2f ms p99 %.2f ms; CPU per request %s; dropline per hold ÷ floor per request %.2f",
			res.Floor.PerSecond(res.Floor.Requests), ms(res.Floor.P50US), ms(res.Floor.P99US), res.FloorCPU,
			div(float64(res.ServerCPU), float64(res.FloorCPU)))
	}
	if err := waitDrained(ctx, api.client, base, time.Minute); err != nil {
		return res, err
	}
	if cfg.ReserveOnly {
		return res, bareBaseline(ctx, cfg, &res, redisProc, redisAddr)
	}

	// The storm runs next, before the baselines: its ratio divides its
	// rate by the reserve step's, and the closer the two steps, the more
	// alike the machine's speed (on a shared machine it moves from one
	// minute to the next).
	cfg.logf("sold-out storm, %d buyers, wrk -c %d, %s ...", cfg.StormBuyers, cfg.Connections, cfg.Step)
	storm := w
	storm.tokensFile, storm.sku = stormFile, soldOut
	stormProfiled := make(chan error, 1)
	if adminBase != "" {
		go func() { stormProfiled <- takeProfile(ctx, adminBase, cfg.Step-time.Second, cfg.Profile+".storm") }()
	} else {
		stormProfiled <- nil
	}
	cpu0, rcpu0 = server.cpuTime(), redisProc.cpuTime()
	if res.Storm, err = storm.run(ctx); err != nil {
		return res, err
	}
	if err := <-stormProfiled; err != nil {
		return res, err
	}
	// The storm's CPU per answer, as the reserve step's per hold: the
	// figure that holds still on a shared machine.
	if n := res.Storm.Requests; n > 0 {
		res.StormCPU = (server.cpuTime() - cpu0) / time.Duration(n)
		res.StormRedisCPU = (redisProc.cpuTime() - rcpu0) / time.Duration(n)
		res.StormLoadCPU = res.Storm.CPU / time.Duration(n)
	}
	cfg.logf("  %.0f answers/s (%d out of stock, %d rate limited, %d other), p50 %.2f ms p99 %.2f ms; CPU per answer: dropline %s, redis-server %s, wrk %s",
		res.Storm.PerSecond(res.Storm.Requests), res.Storm.OutOfStock, res.Storm.RateLimited, res.Storm.Other+res.Storm.Failed,
		ms(res.Storm.P50US), ms(res.Storm.P99US), res.StormCPU, res.StormRedisCPU, res.StormLoadCPU)
	if cfg.Floor != "" {
		cfg.logf("bare net/http handler (the sold-out answer's bytes), wrk -c %d, %s ...", cfg.Connections, cfg.Step)
		if res.Bare, res.BareCPU, err = floorRun(ctx, cfg, "bare", storm, func(r WrkResult) int64 { return r.OutOfStock }); err != nil {
			return res, err
		}
		cfg.logf("  %.0f requests/s, p50 %.2f ms p99 %.2f ms; CPU per request %s, wrk %s; dropline per storm answer ÷ bare handler per request %.2f; storm ÷ holds at most %.2f with net/http",
			res.Bare.PerSecond(res.Bare.Requests), ms(res.Bare.P50US), ms(res.Bare.P99US), res.BareCPU, res.bareLoadCPU(),
			div(float64(res.StormCPU), float64(res.BareCPU)), res.StormCeiling())
	}
	if cfg.ReserveAndStorm {
		cfg.logf("  storm out-of-stock answers/s ÷ successful holds/s: %.2f",
			div(res.Storm.PerSecond(res.Storm.OutOfStock), res.Reserve.PerSecond(res.Reserve.Held)))
		return res, nil
	}
	if err := baselines(ctx, cfg, &res, redisProc, redisAddr, dir, dbURL); err != nil {
		return res, err
	}

	res.SteadyRate = 0.8 * res.Reserve.PerSecond(res.Reserve.Held)
	cfg.logf("constant rate %.0f/s (80 %% of the maximum), %s ...", res.SteadyRate, cfg.Step)
	steady := w
	steady.rate = res.SteadyRate
	if res.Steady, err = steady.run(ctx); err != nil {
		return res, err
	}
	cfg.logf("  %.0f holds/s, p50 %.2f ms p90 %.2f ms p99 %.2f ms",
		res.Steady.PerSecond(res.Steady.Held), ms(res.Steady.P50US), ms(res.Steady.P90US), ms(res.Steady.P99US))
	if err := waitDrained(ctx, api.client, base, time.Minute); err != nil {
		return res, err
	}

	cfg.logf("sustained peak, wrk -c %d, %s, sampling /metrics ...", cfg.Connections, cfg.Peak)
	w.duration = cfg.Peak
	if res.Peak, err = peak(ctx, w, api.client, base, dbURL); err != nil {
		return res, err
	}
	cfg.logf("  %.0f events/s, applied %.0f/s, apply capacity %.0f/s (%.0f events a batch, busy %.0f %% of the time), postgres CPU %s per event; lag p50 %.2f s p99 %.2f s max %.2f s; drained in %.1f s",
		res.Peak.EventRate, res.Peak.AppliedRate, res.Peak.Capacity, res.Peak.BatchMean, 100*res.Peak.BusyShare, res.Peak.PostgresCPU,
		res.Peak.LagP50, res.Peak.LagP99, res.Peak.LagMax, res.Peak.DrainSeconds)
	return res, nil
}

// floorRun starts the floor server of mode (cmd/bench-floor: http or
// bare), warms it up and drives it as w drives Dropline (same script,
// tokens, body and connections), returning wrk's result and the floor's CPU
// time per request. Every request must be answered as expected: expected
// counts those that were (holds from the HTTP floor, OUT_OF_STOCK from the
// bare handler). The floor is stopped before it returns.
func floorRun(ctx context.Context, cfg Config, mode string, w wrkRun, expected func(WrkResult) int64) (WrkResult, time.Duration, error) {
	port, err := loopback.FreePort()
	if err != nil {
		return WrkResult{}, 0, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(cfg.Floor, mode, addr) //nolint:gosec // the binary the Makefile just built
	if err := cmd.Start(); err != nil {
		return WrkResult{}, 0, fmt.Errorf("starting the floor server: %w", err)
	}
	p := &process{name: "bench-floor", cmd: cmd}
	defer p.stop(5 * time.Second)
	w.base = "http://" + addr
	if err := waitReady(ctx, w.base, 10*time.Second); err != nil {
		return WrkResult{}, 0, fmt.Errorf("the floor server: %w", err)
	}
	d := w.duration
	w.duration = 3 * time.Second
	if _, err := w.run(ctx); err != nil {
		return WrkResult{}, 0, err
	}
	w.duration = d
	cpu0 := p.cpuTime()
	r, err := w.run(ctx)
	if err != nil {
		return r, 0, err
	}
	if n := expected(r); n == 0 || n != r.Requests {
		return r, 0, fmt.Errorf("the floor server (%s) answered %d of %d requests as expected (held %d, out of stock %d, rate limited %d, other %d, failed %d)",
			mode, n, r.Requests, r.Held, r.OutOfStock, r.RateLimited, r.Other, r.Failed)
	}
	return r, (p.cpuTime() - cpu0) / time.Duration(r.Requests), nil
}

// peak runs w while sampling the write-behind metrics every 250 ms, then
// waits for the backlog to drain.
func peak(ctx context.Context, w wrkRun, client *http.Client, base, dbURL string) (PeakResult, error) {
	var p PeakResult
	first, err := scrape(ctx, client, base)
	if err != nil {
		return p, err
	}
	pg0 := backends(ctx, dbURL)
	stop := make(chan struct{})
	samples := make(chan []metricsSample, 1)
	go func() {
		var got []metricsSample
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				samples <- got
				return
			case <-t.C:
				if s, err := scrape(ctx, client, base); err == nil {
					got = append(got, s)
				}
			}
		}
	}()
	p.Reserve, err = w.run(ctx)
	close(stop)
	got := <-samples
	if err != nil {
		return p, err
	}
	end, err := scrape(ctx, client, base)
	if err != nil {
		return p, err
	}
	pgCPU := machine.CPUSince(pg0, backends(ctx, dbURL))
	p.Samples = len(got)
	p.EventRate = p.Reserve.PerSecond(p.Reserve.Held)
	if secs := end.at.Sub(first.at).Seconds(); secs > 0 {
		p.AppliedRate = (end.applied - first.applied) / secs
	}
	// The checks that acknowledge batches committed unflushed when no
	// later batch did are busy time too.
	if busy := end.batchSeconds - first.batchSeconds + end.checkSeconds - first.checkSeconds; busy > 0 {
		p.Capacity = (end.applied - first.applied) / busy
		if secs := end.at.Sub(first.at).Seconds(); secs > 0 {
			p.BusyShare = busy / secs
		}
	}
	if n := end.batches - first.batches; n > 0 {
		p.BatchMean = (end.applied - first.applied) / n
	}
	if applied := end.applied - first.applied; applied > 0 {
		p.PostgresCPU = time.Duration(float64(pgCPU) / applied)
	}
	lags := make([]time.Duration, 0, len(got))
	for _, s := range got {
		lags = append(lags, time.Duration(s.lag*float64(time.Second)))
		p.BacklogMax = max(p.BacklogMax, s.backlog)
	}
	p.LagP50 = percentileMS(lags, 50) / 1000
	p.LagP99 = percentileMS(lags, 99) / 1000
	p.LagMax = percentileMS(lags, 100) / 1000
	t0 := time.Now()
	if err := waitDrained(ctx, client, base, 2*time.Minute); err != nil {
		return p, err
	}
	p.DrainSeconds = time.Since(t0).Seconds()
	return p, nil
}

// bareBaseline runs the bare reserve-shaped script (redisBaseline) and
// reads redis-server's CPU and commands per call.
func bareBaseline(ctx context.Context, cfg Config, res *Result, redisProc *process, redisAddr string) (err error) {
	cfg.logf("reserve-shaped script by EVALSHA, redis-benchmark -c %d ...", cfg.Connections)
	rs0, _ := readRedisStats(ctx, redisAddr)
	rcpu0 := redisProc.cpuTime()
	if res.Redis, err = redisBaseline(ctx, redisAddr, cfg.Connections, int(30000*cfg.Step.Seconds())); err != nil {
		return err
	}
	if res.Redis.Requests > 0 {
		res.RedisBareCPU = (redisProc.cpuTime() - rcpu0) / time.Duration(res.Redis.Requests)
	}
	rs1, _ := readRedisStats(ctx, redisAddr)
	cfg.logf("  %.0f/s, p50 %.2f ms p99 %.2f ms; redis-server CPU per call %s; per hold ÷ per bare call %.2f",
		res.Redis.PerSecond, res.Redis.P50MS, res.Redis.P99MS, res.RedisBareCPU, div(float64(res.RedisCPU), float64(res.RedisBareCPU)))
	cfg.logf("  redis-server per bare call:\n%s", perOp(rs0, rs1, res.Redis.Requests))
	return nil
}

// takeProfile writes a CPU profile of d from the server's admin listener.
func takeProfile(ctx context.Context, adminBase string, d time.Duration, path string) error {
	secs := max(int(d/time.Second), 1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", adminBase, secs), nil)
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("taking a CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("taking a CPU profile: %s", resp.Status)
	}
	f, err := os.Create(path) //nolint:gosec // the path the operator named
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// waitDrained waits until the write-behind backlog is empty.
func waitDrained(ctx context.Context, client *http.Client, base string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		s, err := scrape(ctx, client, base)
		if err == nil && s.backlog == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("the write-behind backlog did not drain within %s: %w", limit, err)
			}
			return fmt.Errorf("the write-behind backlog did not drain within %s (backlog %.0f)", limit, s.backlog)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func mintBuyers(iss *auth.Issuer, dir, name string, n int) ([]string, string, error) {
	tokens := make([]string, n)
	for i := range tokens {
		t, err := iss.Mint(fmt.Sprintf("%s-%05d", name, i), false, 4*time.Hour)
		if err != nil {
			return nil, "", err
		}
		tokens[i] = t
	}
	path := filepath.Join(dir, name+".tokens")
	return tokens, path, os.WriteFile(path, []byte(strings.Join(tokens, "\n")+"\n"), 0o600)
}

// apiClient is the benchmark's own GraphQL client, for setup and checks.
type apiClient struct {
	base   string
	client *http.Client
	admin  string
}

func (a apiClient) do(ctx context.Context, query string, vars map[string]any, out any) error {
	body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.admin)
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("%s: %s", resp.Status, raw)
	}
	if len(env.Errors) > 0 {
		return errors.New(env.Errors[0].Message)
	}
	return json.Unmarshal(env.Data, out)
}

func (a apiClient) createProduct(ctx context.Context, sku string, stock int) error {
	var out struct {
		CreateProduct struct {
			UserErrors []struct{ Code, Message string } `json:"userErrors"`
		} `json:"createProduct"`
	}
	err := a.do(ctx, `mutation($i: CreateProductInput!) { createProduct(input: $i) { userErrors { code message } } }`,
		map[string]any{"i": map[string]any{"sku": sku, "name": sku, "price": map[string]any{"amount": 1000, "currency": "EUR"}, "stock": stock}}, &out)
	if err != nil {
		return fmt.Errorf("creating %s: %w", sku, err)
	}
	if ue := out.CreateProduct.UserErrors; len(ue) > 0 {
		return fmt.Errorf("creating %s: %s %s", sku, ue[0].Code, ue[0].Message)
	}
	return nil
}

func (a apiClient) available(ctx context.Context, sku string) (int64, error) {
	var out struct {
		Product *struct {
			Stock struct {
				Available int64 `json:"available"`
			} `json:"stock"`
		} `json:"product"`
	}
	if err := a.do(ctx, `query($s: ID!) { product(sku: $s) { stock { available } } }`, map[string]any{"s": sku}, &out); err != nil {
		return 0, err
	}
	if out.Product == nil {
		return 0, fmt.Errorf("product %s not found", sku)
	}
	return out.Product.Stock.Available, nil
}

func ms(us int64) float64 { return float64(us) / 1000 }

// baselines measures the reserve-shaped script by EVALSHA alone
// (redis-benchmark) and PostgreSQL alone (pgbench), into res.
func baselines(ctx context.Context, cfg Config, res *Result, redisProc *process, redisAddr, dir, dbURL string) (err error) {
	if err := bareBaseline(ctx, cfg, res, redisProc, redisAddr); err != nil {
		return err
	}

	cfg.logf("PostgreSQL only, pgbench -c %d, %s ...", cfg.Connections, cfg.Step)
	if res.Postgres, err = postgresBaseline(ctx, dir, dbURL, cfg.Connections, cfg.Step); err != nil {
		return err
	}
	cfg.logf("  %.0f/s, p50 %.2f ms p99 %.2f ms", res.Postgres.PerSecond, res.Postgres.P50MS, res.Postgres.P99MS)
	return nil
}
