package flashsale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptrace"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/machine"
)

// Bounds on the watchers.
const (
	MaxWatchers = 50_000
	MaxWatchSKU = 5_000
	MaxChanges  = 10_000
	// PerSourceAddr is how many watchers share one loopback source address
	// by default, below the server's default per-address cap (256).
	PerSourceAddr = 200
	// MaxSourceAddrs: 127.0.0.2 to 127.0.0.251.
	MaxSourceAddrs = 250
)

// WatchResult is what the live watchers measured.
type WatchResult struct {
	Transport   string `json:"transport"`
	Watchers    int    `json:"watchers"`
	SKUs        int    `json:"skus"`
	SourceAddrs int    `json:"sourceAddrs"`
	// Connected watchers received their first value; Failed never did
	// (connection refused, subscription error), with the first errors.
	Connected      int      `json:"connected"`
	Failed         int      `json:"failed"`
	Errors         []string `json:"errors,omitempty"`
	ConnectSeconds float64  `json:"connectSeconds"`

	// RSS of the servers (summed over targets) before the watchers
	// connected and once they were connected and idle.
	RSSBeforeBytes    int64   `json:"rssBeforeBytes"`
	RSSIdleBytes      int64   `json:"rssIdleBytes"`
	RSSPerWatcherKiB  float64 `json:"rssPerWatcherKiB"`
	GoroutinesBefore  int     `json:"goroutinesBefore"`
	GoroutinesIdle    int     `json:"goroutinesIdle"`
	GoroutinesPerConn float64 `json:"goroutinesPerWatcher"`

	// The measured changes: Changes reserves of one unit, ChangeRate per
	// second; ChangesFailed were refused and are not measured.
	Changes       int     `json:"changes"`
	ChangesFailed int     `json:"changesFailed"`
	ChangeRate    float64 `json:"changeRate"`
	// Deliveries: from sending a change to a watcher receiving a value at
	// or below it, one per (change, watcher of its SKU).
	Deliveries int `json:"deliveries"`
	// Received is how many values the watchers received meanwhile (fewer
	// than Deliveries when values were coalesced on the way).
	Received int       `json:"received"`
	Missing  int       `json:"missing"`
	Latency  Quantiles `json:"latency"`
	// ToAll: per change, until the last watcher of its SKU had it;
	// ToFirst, until the first one did. ToFirst is the change, its
	// announcement and the hub's pacing; ToAll minus ToFirst is the
	// fan-out to every watcher.
	ToAll   Quantiles `json:"toAll"`
	ToFirst Quantiles `json:"toFirst"`
	// Reserve: how long each change's reserve took to answer, which the
	// latencies above include up to the moment Redis made the change.
	Reserve Quantiles `json:"reserve"`
	// ReserveWritten: how long each reserve took to leave the driver.
	ReserveWritten Quantiles `json:"reserveWritten"`
	// CPU seconds the servers (process_cpu_seconds_total, summed over
	// targets) and this driver spent during the measured changes, per
	// change: the cost of a delivery to every watcher, robust to a busy
	// machine where the latency is not.
	ServerCPUPerChangeMs float64 `json:"serverCpuPerChangeMs"`
	DriverCPUPerChangeMs float64 `json:"driverCpuPerChangeMs"`

	// Convergence after the drop: watchers whose last value equals the
	// final stock of their SKU, and how long after the final reading the
	// last of them got there.
	Converged        int     `json:"converged"`
	ConvergedSeconds float64 `json:"convergedSeconds"`
	Dropped          int     `json:"dropped"`

	LoadAvg string `json:"loadAvg"`
	// Latencies holds every delivery latency; it feeds the report.
	Latencies []time.Duration `json:"-"`
}

// Quantiles of a latency distribution, in milliseconds.
type Quantiles struct {
	P50ms float64 `json:"p50Ms"`
	P90ms float64 `json:"p90Ms"`
	P99ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

func quantiles(lat []time.Duration) Quantiles {
	if len(lat) == 0 {
		return Quantiles{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return Quantiles{P50ms: ms(Percentile(s, 0.5)), P90ms: ms(Percentile(s, 0.9)),
		P99ms: ms(Percentile(s, 0.99)), MaxMs: ms(s[len(s)-1])}
}

// receipt is one value a watcher received during the measured changes.
type receipt struct {
	At        time.Duration // since the watch began
	Available int
}

// change is one measured change: a reserve of one unit of SKU sent At,
// after which the SKU's availability is at most Target.
type change struct {
	SKU    int
	At     time.Duration
	Target int
	OK     bool
	// Wrote is how long after At the reserve was written to the server
	// (the driver's own delay in getting it out), Answered how long after
	// At its answer came.
	Wrote, Answered time.Duration
}

// deliveryLatencies computes, for every successful change and every
// watcher of its SKU, the time from sending the change to the watcher's
// first value at or below the change's target (toAll: the slowest watcher
// of each change; toFirst: the fastest). A watcher that never got there
// counts as missing.
func deliveryLatencies(changes []change, skuOf []int, recv [][]receipt) (lat, toAll, toFirst []time.Duration, missing int) {
	for _, c := range changes {
		if !c.OK {
			continue
		}
		worst, best, seen, complete := time.Duration(0), time.Duration(-1), false, true
		for w, rs := range recv {
			if skuOf[w] != c.SKU {
				continue
			}
			seen = true
			i := slices.IndexFunc(rs, func(r receipt) bool { return r.Available <= c.Target })
			if i < 0 {
				missing++
				complete = false
				continue
			}
			d := max(0, rs[i].At-c.At)
			lat = append(lat, d)
			worst = max(worst, d)
			if best < 0 || d < best {
				best = d
			}
		}
		if seen && complete {
			toAll = append(toAll, worst)
		}
		if best >= 0 {
			toFirst = append(toFirst, best)
		}
	}
	return lat, toAll, toFirst, missing
}

// watcher is one live subscriber and what it saw.
type watcher struct {
	sku int
	c   *watchConn

	mu    sync.Mutex
	last  Stock
	have  bool
	first chan struct{} // closed on the first value
	recv  []receipt
	err   error
	done  bool
}

// watch is the watchers of one run.
type watch struct {
	d       *Driver
	start   time.Time
	skus    []string
	ws      []*watcher
	record  atomic.Bool
	wg      sync.WaitGroup
	res     WatchResult
	changes []change
	holds   []changeHold
}

type changeHold struct {
	bearer, token string
	client        *Client
}

func (w *watch) status(format string, args ...any) {
	if w.d.cfg.Status != nil {
		w.d.cfg.Status(fmt.Sprintf(format, args...))
	}
}

func (wr *watcher) run(base time.Time, record *atomic.Bool) {
	for {
		s, err := wr.c.next()
		now := time.Since(base)
		wr.mu.Lock()
		if err != nil {
			if !wr.have || !errors.Is(err, io.EOF) {
				wr.err = err
			}
			wr.done = true
			if !wr.have {
				close(wr.first)
			}
			wr.mu.Unlock()
			return
		}
		if record.Load() {
			wr.recv = append(wr.recv, receipt{At: now, Available: s.Available})
		}
		wr.last = s
		if !wr.have {
			wr.have = true
			close(wr.first)
		}
		wr.mu.Unlock()
	}
}

// watchSKUs returns the SKUs the watchers watch: the drop's, and in the
// many-SKUs mode more created for the run.
func (d *Driver) watchSKUs(ctx context.Context, hot string) ([]string, error) {
	cfg := d.cfg
	skus := []string{hot}
	if cfg.WatchSKUs <= 1 {
		return skus, nil
	}
	extra := make([]string, cfg.WatchSKUs-1)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range extra {
		extra[i] = fmt.Sprintf("WATCH-%s-%d", cfg.RunID, i+1)
		g.Go(func() error {
			// One admin principal per product: the mutation rate limit is
			// per principal.
			admin, err := d.issuer.Mint("flashsale-admin-"+strconv.Itoa(i), true, time.Hour)
			if err != nil {
				return err
			}
			ue, err := d.clients[0].CreateProduct(gctx, admin, ProductInput{SKU: extra[i], Name: "flashsale watch " + cfg.RunID, Stock: cfg.Stock})
			if err != nil {
				return fmt.Errorf("creating %s: %w", extra[i], err)
			}
			if ue != nil {
				return fmt.Errorf("creating %s: %s: %s", extra[i], ue.Code, ue.Message)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return append(skus, extra...), nil
}

// startWatch connects the watchers, measures the servers' memory once they
// are idle, then makes the measured changes and times their delivery. The
// watchers stay connected for the drop; finishWatch checks that they
// converge.
func (d *Driver) startWatch(ctx context.Context, hot string) (*watch, error) {
	cfg := d.cfg
	skus, err := d.watchSKUs(ctx, hot)
	if err != nil {
		return nil, err
	}
	addrs := cfg.SourceAddrs
	if addrs == 0 {
		addrs = min(MaxSourceAddrs, (cfg.Watchers+PerSourceAddr-1)/PerSourceAddr)
	}
	w := &watch{d: d, start: time.Now(), skus: skus}
	w.res = WatchResult{Transport: cfg.WatchTransport, Watchers: cfg.Watchers, SKUs: len(skus), SourceAddrs: addrs,
		ChangeRate: cfg.ChangeRate}
	w.res.RSSBeforeBytes, w.res.GoroutinesBefore, _ = d.serverMemory(ctx)

	w.status("connecting %d %s watchers of %d SKU(s) from %d source addresses", cfg.Watchers, cfg.WatchTransport, len(skus), addrs)
	t0 := time.Now()
	w.ws = make([]*watcher, cfg.Watchers)
	var errMu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(128)
	for i := range w.ws {
		wr := &watcher{sku: i % len(skus), first: make(chan struct{})}
		w.ws[i] = wr
		local := net.IPv4(127, 0, 0, byte(2+i%addrs))
		c := d.clients[i%len(d.clients)]
		g.Go(func() error {
			conn, err := dialWatch(gctx, c.Endpoint, local, cfg.WatchTransport, skus[wr.sku], cfg.Timeout)
			if err != nil {
				errMu.Lock()
				wr.err, wr.done = err, true
				close(wr.first)
				errMu.Unlock()
				return nil
			}
			wr.c = conn
			w.wg.Add(1)
			go func() { defer w.wg.Done(); wr.run(w.start, &w.record) }()
			return nil
		})
	}
	_ = g.Wait()
	deadline := time.After(cfg.Timeout + 30*time.Second)
	for _, wr := range w.ws {
		select {
		case <-wr.first:
		case <-deadline:
		case <-ctx.Done():
			w.close()
			return nil, ctx.Err()
		}
	}
	for _, wr := range w.ws {
		wr.mu.Lock()
		switch {
		case wr.have:
			w.res.Connected++
		default:
			w.res.Failed++
			if len(w.res.Errors) < 5 {
				msg := "no first value in time"
				if wr.err != nil {
					msg = wr.err.Error()
				}
				w.res.Errors = append(w.res.Errors, msg)
			}
		}
		wr.mu.Unlock()
	}
	w.res.ConnectSeconds = time.Since(t0).Seconds()
	w.status("%d watchers connected in %.1fs (%d failed)", w.res.Connected, w.res.ConnectSeconds, w.res.Failed)

	// Idle memory: the subscriptions are set up and nothing changes.
	sleep(ctx, time.Second)
	w.res.RSSIdleBytes, w.res.GoroutinesIdle, _ = d.serverMemory(ctx)
	if w.res.Connected > 0 && w.res.RSSBeforeBytes > 0 {
		w.res.RSSPerWatcherKiB = float64(w.res.RSSIdleBytes-w.res.RSSBeforeBytes) / 1024 / float64(w.res.Connected)
		w.res.GoroutinesPerConn = float64(w.res.GoroutinesIdle-w.res.GoroutinesBefore) / float64(w.res.Connected)
	}
	if err := w.changePhase(ctx); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// measureInitial reads the availability of every watched SKU.
func (d *Driver) measureInitial(ctx context.Context, skus []string) ([]int, error) {
	out := make([]int, len(skus))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, sku := range skus {
		g.Go(func() error {
			info, ok, err := d.clients[0].Product(gctx, sku)
			if err != nil {
				return fmt.Errorf("reading %s: %w", sku, err)
			}
			if !ok {
				return fmt.Errorf("reading %s: no such product", sku)
			}
			out[i] = info.Stock.Available
			return nil
		})
	}
	return out, g.Wait()
}

// changePhase makes the measured changes: Changes ticks at ChangeRate, each
// reserving one unit of the next SKUs in turn (one SKU per tick on the hot
// SKU; in the many-SKUs mode enough per tick to touch every SKU), by a
// principal of its own. Nothing else changes the stock meanwhile, so after
// the n-th change of a SKU its availability is at most initial-n.
func (w *watch) changePhase(ctx context.Context) error {
	d, cfg := w.d, w.d.cfg
	initial, err := d.measureInitial(ctx, w.skus)
	if err != nil {
		return err
	}
	perTick := max(1, (len(w.skus)+cfg.Changes-1)/cfg.Changes)
	w.res.LoadAvg = machine.LoadAverage()
	w.status("making %d changes at %.0f/s (%d SKU(s) each); load average %s", cfg.Changes, cfg.ChangeRate, perTick, w.res.LoadAvg)
	counts := make([]int, len(w.skus))
	oks := make([]bool, cfg.Changes*perTick)               // written by the reserves, read after calls.Wait
	answered := make([]time.Duration, cfg.Changes*perTick) // likewise
	wrote := make([]atomic.Int64, cfg.Changes*perTick)
	var mu sync.Mutex
	var calls sync.WaitGroup
	_, _, serverCPU0 := d.serverMemory(ctx)
	driverCPU0 := machine.SelfCPU()
	resumeGC := pauseGC()
	defer resumeGC()
	w.record.Store(true)
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.ChangeRate))
	next := 0
	for n := 0; n < cfg.Changes; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				calls.Wait()
				return ctx.Err()
			case <-tick.C:
			}
		}
		for k := 0; k < perTick; k++ {
			sku := next % len(w.skus)
			next++
			if counts[sku] >= initial[sku] {
				continue // nothing left to take
			}
			counts[sku]++
			idx := len(w.changes)
			w.changes = append(w.changes, change{SKU: sku, Target: initial[sku] - counts[sku]})
			principal := "fs-" + cfg.RunID + "-w" + strconv.Itoa(idx)
			bearer, err := d.issuer.Mint(principal, false, time.Hour)
			if err != nil {
				tick.Stop()
				return err
			}
			c := d.clients[idx%len(d.clients)]
			w.changes[idx].At = time.Since(w.start)
			calls.Add(1)
			at := w.changes[idx].At
			rctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
				wrote[idx].Store(int64(time.Since(w.start) - at))
			}})
			go func() {
				defer calls.Done()
				r, ue, err := c.Reserve(rctx, bearer, ReserveInput{SKU: w.skus[sku], Quantity: 1,
					IdempotencyKey: "flashsale-" + cfg.RunID + "-w" + strconv.Itoa(idx), HoldSeconds: int(cfg.Hold / time.Second)})
				mu.Lock()
				defer mu.Unlock()
				answered[idx] = time.Since(w.start) - at
				if err == nil && ue == nil {
					oks[idx] = true
					w.holds = append(w.holds, changeHold{bearer: bearer, token: r.Token, client: c})
				}
			}()
		}
	}
	tick.Stop()
	calls.Wait()
	for i := range w.changes {
		w.changes[i].OK, w.changes[i].Answered = oks[i], answered[i]
		w.changes[i].Wrote = time.Duration(wrote[i].Load())
	}

	// Wait until every watcher reached the last target of its SKU, or the
	// convergence timeout.
	last := make([]int, len(w.skus))
	for i := range last {
		last[i] = initial[i] - counts[i]
	}
	deadline := time.Now().Add(cfg.ConvergeTimeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		behind := 0
		for _, wr := range w.ws {
			wr.mu.Lock()
			if !wr.done && (!wr.have || wr.last.Available > last[wr.sku]) {
				behind++
			}
			wr.mu.Unlock()
		}
		if behind == 0 {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	w.record.Store(false)
	driverCPU1 := machine.SelfCPU()
	_, _, serverCPU1 := d.serverMemory(ctx)
	resumeGC()
	w.res.LoadAvg += " .. " + machine.LoadAverage()
	if n := float64(len(w.changes)); n > 0 {
		w.res.ServerCPUPerChangeMs = (serverCPU1 - serverCPU0) * 1000 / n
		w.res.DriverCPUPerChangeMs = (driverCPU1 - driverCPU0).Seconds() * 1000 / n
	}

	skuOf := make([]int, 0, len(w.ws))
	recv := make([][]receipt, 0, len(w.ws))
	for _, wr := range w.ws {
		wr.mu.Lock()
		if wr.have {
			skuOf = append(skuOf, wr.sku)
			recv = append(recv, wr.recv)
			w.res.Received += len(wr.recv)
		}
		wr.recv = nil
		wr.mu.Unlock()
	}
	for _, c := range w.changes {
		w.res.Changes++
		if !c.OK {
			w.res.ChangesFailed++
		}
	}
	lat, toAll, toFirst, missing := deliveryLatencies(w.changes, skuOf, recv)
	w.res.Deliveries, w.res.Missing = len(lat), missing
	w.res.Latency, w.res.ToAll, w.res.ToFirst, w.res.Latencies = quantiles(lat), quantiles(toAll), quantiles(toFirst), lat
	reserves := make([]time.Duration, 0, len(w.changes))
	wrotes := make([]time.Duration, 0, len(w.changes))
	for _, c := range w.changes {
		if c.OK {
			reserves = append(reserves, c.Answered)
			wrotes = append(wrotes, c.Wrote)
		}
	}
	w.res.Reserve, w.res.ReserveWritten = quantiles(reserves), quantiles(wrotes)
	w.status("change-to-watcher latency p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d missing",
		w.res.Latency.P50ms, w.res.Latency.P99ms, w.res.Latency.MaxMs, missing)

	// Give the units back before the drop.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, h := range w.holds {
		g.Go(func() error {
			_, _, _ = h.client.Cancel(gctx, h.bearer, h.token)
			return nil
		})
	}
	return g.Wait()
}

// finish waits until every watcher's last value equals the final
// stock of its SKU (the drop's SKU: final; the others are read again),
// then closes them.
func (w *watch) finish(ctx context.Context, final Stock) (WatchResult, error) {
	defer w.close()
	finals := make([]Stock, len(w.skus))
	finals[0] = final
	if len(w.skus) > 1 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := 1; i < len(w.skus); i++ {
			g.Go(func() error {
				info, ok, err := w.d.clients[0].Product(gctx, w.skus[i])
				if err != nil {
					return fmt.Errorf("reading %s after the drop: %w", w.skus[i], err)
				}
				if !ok {
					return fmt.Errorf("reading %s after the drop: no such product", w.skus[i])
				}
				finals[i] = info.Stock
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return WatchResult{}, err
		}
	}
	t0 := time.Now()
	deadline := t0.Add(w.d.cfg.ConvergeTimeout)
	for {
		converged, dropped := 0, 0
		for _, wr := range w.ws {
			wr.mu.Lock()
			switch {
			case wr.have && wr.last == finals[wr.sku]:
				converged++
			case wr.have && wr.done:
				dropped++
			}
			wr.mu.Unlock()
		}
		w.res.Converged, w.res.Dropped = converged, dropped
		if converged == w.res.Connected || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	w.res.ConvergedSeconds = time.Since(t0).Seconds()
	w.status("%d of %d watchers converged to the final stock", w.res.Converged, w.res.Connected)
	return w.res, nil
}

func (w *watch) close() {
	for _, wr := range w.ws {
		if wr.c != nil {
			wr.c.close()
		}
	}
	w.wg.Wait()
}

// serverMemory sums the resident memory, goroutines and CPU seconds the
// targets report on /metrics (the Go and process collectors); zeros when
// unreadable.
func (d *Driver) serverMemory(ctx context.Context) (rss int64, goroutines int, cpu float64) {
	for _, c := range d.clients {
		m := scrape(ctx, c)
		rss += int64(m["process_resident_memory_bytes"])
		goroutines += int(m["go_goroutines"])
		cpu += m["process_cpu_seconds_total"]
	}
	return rss, goroutines, cpu
}

// pauseGC turns the driver's garbage collector off while the changes are
// timed, unless the heap grows by another GiB, and returns what turns it
// back on: a collection's marking takes one of the machine's two cores
// for tens of milliseconds, during which the watchers' goroutines wait, and
// that would be timed as the server's delay.
func pauseGC() (resume func()) {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	limit := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(int64(m.HeapSys) + 1<<30)
	percent := debug.SetGCPercent(-1)
	return func() { // twice is harmless
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}
