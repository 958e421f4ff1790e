package httpbench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/machine"
	"github.com/dropline/dropline/internal/wsclient"
)

// WaiterResult is what the websocket waiters of queueChanged measured.
type WaiterResult struct {
	Waiters   int
	Connected int
	// RSSPerWaiter is the server's resident memory growth from before the
	// waiters connected to once they were connected and idle, per waiter.
	RSSBefore, RSSIdle int64
	RSSPerWaiter       float64
	// Steps is how many admission steps were announced (seen on the
	// queue's Redis channel) during the measurement; Deliveries how many
	// (step, waiter) pairs arrived, Missing how many never did. A waiter
	// has a step once it read that step's state or a newer one.
	Steps, Deliveries, Missing int
	// Latency is from the step (the time its announcement carries, Redis's
	// clock on this machine) to a waiter reading it off its connection, per
	// (step, waiter); ToAll per step, until its last waiter had it.
	Latency, ToAll Quantiles
	// ServerCPUPerStep is the server's CPU time per announced step during
	// the measurement (the fan-out to every waiter, and the rest of its
	// work: the admission ticker, the hub).
	ServerCPUPerStep time.Duration
	// BenchCPUPerStep is this process's CPU time per announced step over
	// the measurement: the 10,000 clients reading their copies, which
	// share the machine's cores with the server.
	BenchCPUPerStep time.Duration
	Measured        time.Duration
	// AdmittedMeanwhile is how far the queue's admittedThrough moved in
	// Redis over the measurement, whatever the announcements seen.
	AdmittedMeanwhile int64
	// Errors are waiters' streams that ended early.
	Errors []string
}

// Quantiles of a latency distribution, in milliseconds.
type Quantiles struct {
	P50, P99, Max float64
}

func quantilesOf(d []time.Duration) Quantiles {
	if len(d) == 0 {
		return Quantiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) float64 {
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
	}
	return Quantiles{P50: at(0.5), P99: at(0.99), Max: float64(s[len(s)-1].Microseconds()) / 1000}
}

// perSourceAddr is how many waiters share one loopback source address.
const perSourceAddr = 200

// runWaiters connects cfg.Waiters websocket clients watching queueChanged
// of the bench's queue, measures the server's memory per waiter, then
// watches admission steps for cfg.Step: each step's announcement is read
// off Redis by this process too, and each waiter's copy is timed from it.
func runWaiters(ctx context.Context, cfg QueueConfig, base string, rdb *redis.Client, server *process, tokens []string) (WaiterResult, error) {
	res := WaiterResult{Waiters: cfg.Waiters}
	keys, err := rdb.Keys(ctx, "*:q:sku:"+queueSKU).Result()
	if err != nil {
		return res, fmt.Errorf("finding the queue's hash: %w", err)
	}
	if len(keys) != 1 {
		return res, fmt.Errorf("finding the queue's hash: %d keys match", len(keys))
	}
	channel := strings.TrimSuffix(keys[0], "q:sku:"+queueSKU) + "qchanged:sku:" + queueSKU
	pid := server.cmd.Process.Pid
	res.RSSBefore = rss(pid)

	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/graphql"
	// Each waiter reads its stream from the moment it has subscribed, as a
	// browser does: a waiter left unread while the others connect would
	// fill its buffers, and the server would rightly take it for a stalled
	// reader (or hand it a backlog of old steps when the window opens).
	// Only the copies read inside the window are recorded, by the waiter's
	// own reader; they are read once every reader has ended.
	type waiter struct {
		c   *wsclient.Client
		got map[int64]time.Time // admittedThrough -> read off the connection
		// ended is why the stream ended inside the window ("" if it did not).
		ended string
	}
	ws := make([]waiter, cfg.Waiters)
	var window struct {
		sync.Mutex
		from, to time.Time
	}
	inWindow := func(at time.Time) bool {
		window.Lock()
		defer window.Unlock()
		return !window.from.IsZero() && !at.Before(window.from) && at.Before(window.to)
	}
	var readers sync.WaitGroup
	clients := map[int]*http.Client{}
	for i := range (cfg.Waiters + perSourceAddr - 1) / perSourceAddr {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, byte((2+i)/250), byte(2+(i%250)))}
		d := &net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}
		clients[i] = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	closeAll := func() {
		for _, w := range ws {
			if w.c != nil {
				_ = w.c.CloseNow()
			}
		}
		readers.Wait()
	}
	defer closeAll()
	query := `subscription Q($s: ID) { queueChanged(sku: $s) { status admittedThrough waiting } }`
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range ws {
		g.Go(func() error {
			dctx, cancel := context.WithTimeout(gctx, 60*time.Second)
			defer cancel()
			// A waiter whose connection the loaded machine let time out
			// (the server waits 3 s for connection_init) dials again, as a
			// browser would.
			var c *wsclient.Client
			var err error
			for try := 0; try < 3; try++ {
				if c, err = wsclient.Dial(dctx, wsURL, wsclient.Options{HTTPClient: clients[i/perSourceAddr], Buffer: 8,
					InitPayload: map[string]any{"Authorization": "Bearer " + tokens[i%len(tokens)]}}); err == nil || dctx.Err() != nil {
					break
				}
			}
			if err != nil {
				return fmt.Errorf("waiter %d: %w", i, err)
			}
			s, err := c.Subscribe(dctx, query, map[string]any{"s": queueSKU})
			if err != nil {
				_ = c.CloseNow()
				return fmt.Errorf("waiter %d: %w", i, err)
			}
			if _, ok, err := s.Next(dctx); err != nil {
				_ = c.CloseNow()
				return fmt.Errorf("waiter %d: no first value: %w", i, err)
			} else if !ok {
				_ = c.CloseNow()
				return fmt.Errorf("waiter %d: the stream ended before its first value", i)
			}
			ws[i] = waiter{c: c, got: map[int64]time.Time{}}
			w := &ws[i]
			readers.Add(1)
			go func() {
				defer readers.Done()
				for m := range s.C {
					if !inWindow(m.At) {
						continue
					}
					var v struct {
						QueueChanged struct{ AdmittedThrough int64 }
					}
					if json.Unmarshal(m.Data, &v) == nil {
						w.got[v.QueueChanged.AdmittedThrough] = m.At
					}
				}
				if now := time.Now(); inWindow(now) {
					w.ended = fmt.Sprintf("waiter %d: the stream ended at %s: %v", i, now.Format("15:04:05.000"), c.Err())
				}
			}()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.Connected = len(ws)
	time.Sleep(2 * time.Second) // idle: buffers settle
	res.RSSIdle = rss(pid)
	res.RSSPerWaiter = float64(res.RSSIdle-res.RSSBefore) / float64(res.Connected)
	cfg.logf("%d waiters connected: %.1f KiB of server RSS each", res.Connected, res.RSSPerWaiter/1024)

	// The announcements, off Redis: each carries the time of its step
	// (Redis's clock, this machine's), from which every copy is timed, so
	// a late read of the announcement here does not flatter the figure.
	ps := rdb.SSubscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return res, err
	}
	var mu sync.Mutex
	steps := map[int64]time.Time{} // admittedThrough -> the step's time
	through0, _ := rdb.HGet(ctx, keys[0], "through").Int64()
	t0 := time.Now()
	deadline := t0.Add(cfg.Step)
	window.Lock()
	window.from, window.to = t0, deadline
	window.Unlock()
	mctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	cpu0, self0 := server.cpuTime(), machine.SelfCPU()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ch := ps.Channel()
		for {
			select {
			case <-mctx.Done():
				return
			case m := <-ch:
				var a struct{ Through, At int64 }
				if json.Unmarshal([]byte(m.Payload), &a) == nil {
					at := time.UnixMilli(a.At)
					mu.Lock()
					if _, ok := steps[a.Through]; !ok && !at.Before(t0) {
						steps[a.Through] = at
					}
					mu.Unlock()
				}
			}
		}
	}()
	wg.Wait()
	res.Measured = time.Since(t0)
	through1, _ := rdb.HGet(ctx, keys[0], "through").Int64()
	res.AdmittedMeanwhile = through1 - through0
	cpu, self := server.cpuTime()-cpu0, machine.SelfCPU()-self0
	// Every copy read inside the window has been recorded once the
	// readers end.
	closeAll()
	got := make([]map[int64]time.Time, len(ws))
	for i, w := range ws {
		got[i] = w.got
		if w.ended != "" {
			res.Errors = append(res.Errors, w.ended)
		}
	}

	// A waiter has a step once it read that step's state or a newer one
	// (the server hands a reader that is behind the newest state, not every
	// state in between): per waiter, the earliest copy of admittedThrough
	// at or past the step's.
	type copyAt struct {
		through int64
		at      time.Time
	}
	firsts := make([][]copyAt, len(got))
	for i, m := range got {
		cs := make([]copyAt, 0, len(m))
		for th, at := range m {
			cs = append(cs, copyAt{th, at})
		}
		slices.SortFunc(cs, func(a, b copyAt) int { return int(a.through - b.through) })
		for k := len(cs) - 2; k >= 0; k-- { // the earliest copy at or past each
			if cs[k+1].at.Before(cs[k].at) {
				cs[k].at = cs[k+1].at
			}
		}
		firsts[i] = cs
	}
	// Steps at least a second before the end of the window.
	var lat, toAll []time.Duration
	end := deadline.Add(-time.Second)
	for through, at := range steps {
		if at.After(end) {
			continue
		}
		res.Steps++
		var last time.Duration
		for i := range firsts {
			cs := firsts[i]
			k, _ := slices.BinarySearchFunc(cs, through, func(c copyAt, t int64) int { return int(c.through - t) })
			if k == len(cs) {
				res.Missing++
				continue
			}
			res.Deliveries++
			d := max(cs[k].at.Sub(at), 0)
			lat = append(lat, d)
			last = max(last, d)
		}
		toAll = append(toAll, last)
	}
	res.Latency, res.ToAll = quantilesOf(lat), quantilesOf(toAll)
	if len(steps) > 0 {
		res.ServerCPUPerStep = cpu / time.Duration(len(steps))
		res.BenchCPUPerStep = self / time.Duration(len(steps))
	}
	if len(res.Errors) > 0 {
		cfg.logf("%d waiters' streams ended early, first: %s", len(res.Errors), res.Errors[0])
	}
	cfg.logf("%d steps to %d waiters: p50 %.1f ms, p99 %.1f ms, max %.1f ms; to all p99 %.1f ms; %d missing",
		res.Steps, res.Connected, res.Latency.P50, res.Latency.P99, res.Latency.Max, res.ToAll.P99, res.Missing)
	return res, nil
}

// rss is a process's resident set size in bytes, 0 when unreadable.
func rss(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
