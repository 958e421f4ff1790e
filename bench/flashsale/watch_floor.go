package flashsale

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/machine"
)

// FloorWatchResult is the fan-out floor (bench/floor's Broadcaster, served
// by `bench-floor ws`) measured as the server's watchers are: the same
// number of websocket watchers of one SKU from the same source addresses,
// the same number of changes at the same rate, each change one frame of
// the shape Dropline sends written to every socket.
type FloorWatchResult struct {
	Watchers   int `json:"watchers"`
	Connected  int `json:"connected"`
	Changes    int `json:"changes"`
	Deliveries int `json:"deliveries"`
	// Received is how many frames the watchers read (fewer than
	// Deliveries when changes were coalesced).
	Received int       `json:"received"`
	Missing  int       `json:"missing"`
	Latency  Quantiles `json:"latency"`
	ToAll    Quantiles `json:"toAll"`
	// CPUPerChangeMs is the floor's CPU time per change (all its watchers),
	// CPUPerDeliveryUs per (change, watcher), CPUPerFrameUs per frame a
	// watcher read.
	CPUPerChangeMs   float64 `json:"cpuPerChangeMs"`
	CPUPerDeliveryUs float64 `json:"cpuPerDeliveryUs"`
	CPUPerFrameUs    float64 `json:"cpuPerFrameUs"`
	// The server's, from WatchResult: its CPU per change divided by its
	// watchers of the changed SKU, and by the frames its watchers read per
	// change; Ratio and FrameRatio are each ÷ the floor's.
	ServerCPUPerDeliveryUs float64 `json:"serverCpuPerDeliveryUs"`
	ServerCPUPerFrameUs    float64 `json:"serverCpuPerFrameUs"`
	Ratio                  float64 `json:"ratio"`
	FrameRatio             float64 `json:"frameRatio"`
	LoadAvg                string  `json:"loadAvg"`
}

// floorWatch connects cfg.Watchers websocket watchers of one SKU to the
// floor broadcaster at cfg.FloorURL, makes cfg.Changes changes at
// cfg.ChangeRate and times their delivery, then closes the watchers.
func (d *Driver) floorWatch(ctx context.Context) (*FloorWatchResult, error) {
	cfg := d.cfg
	base := strings.TrimSuffix(cfg.FloorURL, "/")
	client := &http.Client{Timeout: cfg.Timeout}
	const sku, total = "FLOOR-HOT", 1_000_000
	addrs := cfg.SourceAddrs
	if addrs == 0 {
		addrs = min(MaxSourceAddrs, (cfg.Watchers+PerSourceAddr-1)/PerSourceAddr)
	}
	res := &FloorWatchResult{Watchers: cfg.Watchers}
	d.watchStatus("floor broadcaster: connecting %d websocket watchers", cfg.Watchers)
	var record atomic.Bool
	start := time.Now()
	ws := make([]*watcher, cfg.Watchers)
	var wg sync.WaitGroup
	defer func() {
		for _, wr := range ws {
			if wr != nil && wr.c != nil {
				wr.c.close()
			}
		}
		wg.Wait()
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(128)
	for i := range ws {
		wr := &watcher{first: make(chan struct{})}
		ws[i] = wr
		local := net.IPv4(127, 0, 0, byte(2+i%addrs))
		g.Go(func() error {
			conn, err := dialWatch(gctx, base+"/graphql", local, TransportWS, sku, cfg.Timeout)
			if err != nil {
				return fmt.Errorf("a floor watcher: %w", err)
			}
			wr.c = conn
			wg.Add(1)
			go func() { defer wg.Done(); wr.run(start, &record) }()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	deadline := time.After(cfg.Timeout + 30*time.Second)
	for _, wr := range ws {
		select {
		case <-wr.first:
		case <-deadline:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		wr.mu.Lock()
		if wr.have {
			res.Connected++
		}
		wr.mu.Unlock()
	}
	if res.Connected != cfg.Watchers {
		return nil, fmt.Errorf("floor broadcaster: %d of %d watchers got a first value", res.Connected, cfg.Watchers)
	}
	sleep(ctx, time.Second)

	res.LoadAvg = machine.LoadAverage()
	floors := &Driver{clients: []*Client{{Endpoint: base + "/graphql", HTTP: client}}}
	_, _, cpu0 := floors.serverMemory(ctx)
	resumeGC := pauseGC()
	defer resumeGC()
	record.Store(true)
	changes := make([]change, 0, cfg.Changes)
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.ChangeRate))
	var calls errgroup.Group
	for n := range cfg.Changes {
		if n > 0 {
			select {
			case <-ctx.Done():
				tick.Stop()
				_ = calls.Wait()
				return nil, ctx.Err()
			case <-tick.C:
			}
		}
		target := total - n - 1
		changes = append(changes, change{SKU: 0, At: time.Since(start), Target: target, OK: true})
		calls.Go(func() error {
			u := fmt.Sprintf("%s/change?sku=%s&available=%d&total=%d", base, sku, target, total)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("floor change: %s", resp.Status)
			}
			return nil
		})
	}
	tick.Stop()
	if err := calls.Wait(); err != nil {
		return nil, err
	}
	last := total - cfg.Changes
	until := time.Now().Add(cfg.ConvergeTimeout)
	for time.Now().Before(until) && ctx.Err() == nil {
		behind := 0
		for _, wr := range ws {
			wr.mu.Lock()
			if !wr.done && wr.last.Available > last {
				behind++
			}
			wr.mu.Unlock()
		}
		if behind == 0 {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	record.Store(false)
	_, _, cpu1 := floors.serverMemory(ctx)
	resumeGC()
	res.LoadAvg += " .. " + machine.LoadAverage()
	skuOf := make([]int, len(ws))
	recv := make([][]receipt, len(ws))
	for i, wr := range ws {
		wr.mu.Lock()
		recv[i] = wr.recv
		res.Received += len(wr.recv)
		wr.mu.Unlock()
	}
	lat, toAll, _, missing := deliveryLatencies(changes, skuOf, recv)
	res.Changes, res.Deliveries, res.Missing = len(changes), len(lat), missing
	res.Latency, res.ToAll = quantiles(lat), quantiles(toAll)
	res.CPUPerChangeMs = (cpu1 - cpu0) * 1000 / float64(len(changes))
	res.CPUPerDeliveryUs = res.CPUPerChangeMs * 1000 / float64(cfg.Watchers)
	if res.Received > 0 {
		res.CPUPerFrameUs = (cpu1 - cpu0) * 1e6 / float64(res.Received)
	}
	d.watchStatus("floor broadcaster: change->all p99 %.0f ms; CPU per delivery %.2f µs, per frame read %.2f µs (%d frames); load average %s",
		res.ToAll.P99ms, res.CPUPerDeliveryUs, res.CPUPerFrameUs, res.Received, res.LoadAvg)
	return res, nil
}

func (d *Driver) watchStatus(format string, args ...any) {
	if d.cfg.Status != nil {
		d.cfg.Status(fmt.Sprintf(format, args...))
	}
}

// compareFloor fills in the server's CPU per delivery and its ratio to the
// floor's: the server's watchers of the changed SKU are its watchers over
// its SKUs (one SKU per change on the hot SKU).
func (f *FloorWatchResult) compareFloor(w WatchResult) {
	if f == nil || w.SKUs == 0 || w.Connected == 0 {
		return
	}
	perChange := float64(w.Connected) / float64(w.SKUs)
	f.ServerCPUPerDeliveryUs = w.ServerCPUPerChangeMs * 1000 / perChange
	if f.CPUPerDeliveryUs > 0 {
		f.Ratio = f.ServerCPUPerDeliveryUs / f.CPUPerDeliveryUs
	}
	if w.Received > 0 && w.Changes > 0 {
		f.ServerCPUPerFrameUs = w.ServerCPUPerChangeMs * 1000 * float64(w.Changes) / float64(w.Received)
	}
	if f.CPUPerFrameUs > 0 {
		f.FrameRatio = f.ServerCPUPerFrameUs / f.CPUPerFrameUs
	}
}
