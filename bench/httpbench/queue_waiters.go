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
	// (step, waiter) pairs arrived, Missing how many never did.
	Steps, Deliveries, Missing int
	// Latency is from the step's announcement reaching this process off
	// Redis to a waiter receiving it, per (step, waiter); ToAll per step,
	// until its last waiter had it.
	Latency, ToAll Quantiles
	// ServerCPUPerStep is the server's CPU time per announced step during
	// the measurement (the fan-out to every waiter, and the rest of its
	// work: the admission ticker, the hub).
	ServerCPUPerStep time.Duration
	Measured         time.Duration
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
	type waiter struct {
		c   *wsclient.Client
		sub *wsclient.Subscription
	}
	ws := make([]waiter, cfg.Waiters)
	clients := map[int]*http.Client{}
	for i := range (cfg.Waiters + perSourceAddr - 1) / perSourceAddr {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, byte((2+i)/250), byte(2+(i%250)))}
		d := &net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}
		clients[i] = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	defer func() {
		for _, w := range ws {
			if w.c != nil {
				_ = w.c.CloseNow()
			}
		}
	}()
	query := `subscription Q($s: ID) { queueChanged(sku: $s) { status admittedThrough waiting } }`
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range ws {
		g.Go(func() error {
			dctx, cancel := context.WithTimeout(gctx, 20*time.Second)
			defer cancel()
			c, err := wsclient.Dial(dctx, wsURL, wsclient.Options{HTTPClient: clients[i/perSourceAddr], Buffer: 8,
				InitPayload: map[string]any{"Authorization": "Bearer " + tokens[i%len(tokens)]}})
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
			ws[i] = waiter{c: c, sub: s}
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

	// The announcements, off Redis.
	ps := rdb.SSubscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return res, err
	}
	var mu sync.Mutex
	steps := map[int64]time.Time{} // admittedThrough -> seen off Redis
	got := make([]map[int64]time.Time, len(ws))
	through0, _ := rdb.HGet(ctx, keys[0], "through").Int64()
	deadline := time.Now().Add(cfg.Step)
	mctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	cpu0, t0 := server.cpuTime(), time.Now()
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
				var a struct{ Through int64 }
				if json.Unmarshal([]byte(m.Payload), &a) == nil {
					mu.Lock()
					if _, ok := steps[a.Through]; !ok {
						steps[a.Through] = time.Now()
					}
					mu.Unlock()
				}
			}
		}
	}()
	for i := range ws {
		got[i] = map[int64]time.Time{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, ok, err := ws[i].sub.Next(mctx)
				if err != nil || !ok {
					if mctx.Err() == nil {
						mu.Lock()
						res.Errors = append(res.Errors, fmt.Sprintf("waiter %d: %v (ok %v)", i, err, ok))
						mu.Unlock()
					}
					return
				}
				var v struct {
					QueueChanged struct{ AdmittedThrough int64 }
				}
				if json.Unmarshal(m.Data, &v) == nil {
					got[i][v.QueueChanged.AdmittedThrough] = m.At
				}
			}
		}()
	}
	wg.Wait()
	res.Measured = time.Since(t0)
	through1, _ := rdb.HGet(ctx, keys[0], "through").Int64()
	res.AdmittedMeanwhile = through1 - through0
	cpu := server.cpuTime() - cpu0

	// Steps whose announcement came at least a second before the end.
	var lat, toAll []time.Duration
	end := deadline.Add(-time.Second)
	for through, at := range steps {
		if at.After(end) {
			continue
		}
		res.Steps++
		var last time.Duration
		for i := range got {
			r, ok := got[i][through]
			if !ok {
				res.Missing++
				continue
			}
			res.Deliveries++
			d := max(r.Sub(at), 0)
			lat = append(lat, d)
			last = max(last, d)
		}
		toAll = append(toAll, last)
	}
	res.Latency, res.ToAll = quantilesOf(lat), quantilesOf(toAll)
	if len(steps) > 0 {
		res.ServerCPUPerStep = cpu / time.Duration(len(steps))
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
