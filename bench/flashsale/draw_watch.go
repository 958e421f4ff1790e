package flashsale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// drawWatcher is one entrant watching its entry with myDrawEntryChanged on
// a websocket of its own: the first value (ENTERED) arrives on connecting,
// the second (the result) is timed.
type drawWatcher struct {
	entrant int
	c       *watchConn
	first   chan struct{}

	mu     sync.Mutex
	got    bool
	result DrawEntry
	at     time.Time
	err    error
}

// drawWatch is the rehearsal's watchers.
type drawWatch struct {
	ws []*drawWatcher
	wg sync.WaitGroup
}

// watchDraw connects cfg.DrawWatchers entrants, spread evenly over them,
// each subscribed to its entry, and waits until each has its first value.
func (d *Driver) watchDraw(ctx context.Context, res *DrawResult, token func(int) (string, error)) (*drawWatch, error) {
	cfg := d.cfg
	n := min(cfg.DrawWatchers, res.Entrants)
	w := &drawWatch{ws: make([]*drawWatcher, n)}
	res.Watchers = n
	if n == 0 {
		return w, nil
	}
	payload, err := subscribePayload(watchDrawDoc, map[string]any{"sku": res.SKU})
	if err != nil {
		return nil, err
	}
	addrs := cfg.SourceAddrs
	if addrs == 0 {
		addrs = min(MaxSourceAddrs, (n+PerSourceAddr-1)/PerSourceAddr)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(128)
	for k := range w.ws {
		wr := &drawWatcher{entrant: k * res.Entrants / n, first: make(chan struct{})}
		w.ws[k] = wr
		local := net.IPv4(127, 0, 0, byte(2+k%addrs))
		c := d.clients[wr.entrant%len(d.clients)]
		g.Go(func() error {
			b, err := token(wr.entrant)
			if err != nil {
				return err
			}
			conn, err := dialSubscriptionAs(gctx, c.Endpoint, local, TransportWS, b, payload, cfg.Timeout)
			if err != nil {
				wr.fail(err)
				close(wr.first)
				return nil
			}
			wr.c = conn
			w.wg.Add(1)
			go func() { defer w.wg.Done(); wr.run() }()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		w.close()
		return nil, err
	}
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
	return w, nil
}

func (wr *drawWatcher) fail(err error) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.err == nil {
		wr.err = err
	}
}

// run reads the watcher's values: the first, then the result; first is
// closed after the first value, or when the stream ends before one.
func (wr *drawWatcher) run() {
	defer wr.c.close()
	var once sync.Once
	defer once.Do(func() { close(wr.first) })
	for {
		msg, err := wr.c.nextMessage()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			wr.fail(err)
			return
		}
		at := time.Now()
		var m struct {
			Payload struct {
				Data struct {
					MyDrawEntryChanged *DrawEntry `json:"myDrawEntryChanged"`
				} `json:"data"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(msg, &m); err != nil || m.Payload.Data.MyDrawEntryChanged == nil {
			wr.fail(fmt.Errorf("entrant %d: unreadable push %.200s", wr.entrant, msg))
			return
		}
		if e := *m.Payload.Data.MyDrawEntryChanged; e.Status == "WON" || e.Status == "LOST" {
			wr.mu.Lock()
			wr.got, wr.result, wr.at = true, e, at
			wr.mu.Unlock()
		}
		once.Do(func() { close(wr.first) })
	}
}

// wait waits for every watcher's result until deadline.
func (w *drawWatch) wait(deadline time.Time) {
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
	}
}

func (w *drawWatch) close() {
	for _, wr := range w.ws {
		if wr.c != nil {
			wr.c.close()
		}
	}
	w.wg.Wait()
}

// judge compares each watcher's push with its entry as read afterwards and
// times the pushes from closesAt.
func (w *drawWatch) judge(res *DrawResult, closesAt time.Time, entries []DrawEntry) {
	var lat []float64
	for _, wr := range w.ws {
		wr.mu.Lock()
		got, e, at, err := wr.got, wr.result, wr.at, wr.err
		wr.mu.Unlock()
		if err != nil && len(res.WatchErrors) < 5 {
			res.WatchErrors = append(res.WatchErrors, err.Error())
		}
		if !got {
			continue
		}
		res.Told++
		lat = append(lat, at.Sub(closesAt).Seconds())
		want := entries[wr.entrant]
		same := e.Status == want.Status && e.Quantity == want.Quantity && e.Place != nil && want.Place != nil && *e.Place == *want.Place
		if e.Status == "WON" {
			same = same && e.Reservation != nil && want.Reservation != nil && e.Reservation.Token == want.Reservation.Token &&
				e.Reservation.Status == "HELD"
		}
		if !same {
			res.TellMismatch++
		}
	}
	if len(lat) == 0 {
		return
	}
	sort.Float64s(lat)
	res.PushP50Seconds, res.PushAllSeconds = lat[len(lat)/2], lat[len(lat)-1]
}

// awaitApplied reads the draw's appliedAt until it is set (or the drain
// timeout passes).
func (d *Driver) awaitApplied(ctx context.Context, res *DrawResult, closesAt time.Time) error {
	c := d.clients[0]
	deadline := closesAt.Add(d.cfg.DrainTimeout)
	for {
		var out struct {
			Product *struct {
				Draw *struct {
					AppliedAt *time.Time `json:"appliedAt"`
				} `json:"draw"`
			} `json:"product"`
		}
		if err := c.do(ctx, "", drawAppliedDoc, map[string]any{"sku": res.SKU}, &out); err != nil {
			return fmt.Errorf("reading the draw of %s: %w", res.SKU, err)
		}
		if out.Product != nil && out.Product.Draw != nil && out.Product.Draw.AppliedAt != nil {
			res.AppliedSeenSeconds = time.Since(closesAt).Seconds()
			res.AppliedSeconds = out.Product.Draw.AppliedAt.Sub(closesAt).Seconds()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not applied %s after closesAt", res.SKU, d.cfg.DrainTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
