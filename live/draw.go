package live

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dropline/dropline/inventory"
)

// Draw results ride on the hub too. Once a draw's result has been carried to
// Redis in full, the drawer publishes one message on the draw's sharded
// channel (inventory.Keys.DrawChannel); the hub holds one Redis
// subscription per draw watched here, and on that message reads the whole
// result once (inventory.Draws.AppliedResult) and hands each local watcher
// its own entry. So 100,000 entrants watching cost Redis one message and
// each process one read of the result, not a read per entrant.
//
// Correctness comes from re-reading, as for stock and queues: the result is
// read when a draw's feed is made, when Redis confirms its channel (again,
// after a reconnect), on the message, and every ResyncInterval while the
// draw is not yet applied, so a lost message costs at most that long.

// drawFeed is the hub's view of one draw.
type drawFeed struct {
	sku     string
	channel string
	kick    chan struct{}
	gone    chan struct{} // closed when the feed is swept

	mu        sync.Mutex
	subs      map[*drawSub]struct{}
	idleSince time.Time
	// result is every entry by principal, once the draw is applied.
	result    map[string]inventory.DrawEntry
	confirmed bool
}

// drawSub is one SubscribeDrawEntry: it receives its entry once.
type drawSub struct {
	principal string
	out       chan inventory.DrawEntry // one slot: written once, never waited on
	sent      bool
}

func (s *drawSub) offer(result map[string]inventory.DrawEntry) {
	if s.sent {
		return
	}
	if e, ok := result[s.principal]; ok {
		s.sent = true
		s.out <- e
	}
}

// SubscribeDrawEntry watches principal's entry in sku's draw: the channel
// carries the entry once the draw's result is applied (the winners hold,
// the losers are queued); it closes when ctx is done or the hub stops
// (without a value if that came first). The caller reads the entry's state
// before subscribing; an entry already decided then needs no subscription.
//
// Errors: *inventory.InvalidInputError for a malformed SKU; ErrNotRunning.
func (h *Hub) SubscribeDrawEntry(ctx context.Context, sku, principal string) (<-chan inventory.DrawEntry, error) {
	if !inventory.ValidSKU(sku) {
		return nil, &inventory.InvalidInputError{Field: "sku", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	s := &drawSub{principal: principal, out: make(chan inventory.DrawEntry, 1)}
	h.mu.Lock()
	if h.state != hubRunning || closed(h.done) {
		h.mu.Unlock()
		return nil, ErrNotRunning
	}
	channel := h.keys.DrawChannel(sku)
	f := h.dfeeds[channel]
	created := f == nil
	if created {
		f = &drawFeed{sku: sku, channel: channel, kick: make(chan struct{}, 1), gone: make(chan struct{}),
			subs: map[*drawSub]struct{}{}}
		h.dfeeds[channel] = f
		h.wg.Add(1)
		// The feed outlives this subscriber: it ends when swept or when
		// the hub stops.
		go h.runDrawFeed(context.WithoutCancel(ctx), f)
	}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.idleSince = time.Time{}
	if f.result != nil {
		s.offer(f.result)
	}
	f.mu.Unlock()
	done := h.done
	h.wg.Add(1)
	h.mu.Unlock()
	if created {
		kick(h.controlKick)
		kick(f.kick)
	}
	go func() {
		defer h.wg.Done()
		select {
		case <-ctx.Done():
		case <-done:
		}
		f.mu.Lock()
		delete(f.subs, s)
		if len(f.subs) == 0 {
			f.idleSince = time.Now()
		}
		close(s.out) // under f.mu: no offer can come after
		f.mu.Unlock()
	}()
	return s.out, nil
}

// runDrawFeed reads f's result when kicked, and every ResyncInterval until
// it is applied, until the feed is swept or the hub stops.
func (h *Hub) runDrawFeed(ctx context.Context, f *drawFeed) {
	defer h.wg.Done()
	every := h.cfg.ResyncInterval
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-h.done:
			return
		case <-f.gone:
			return
		case <-f.kick:
		case <-tick.C:
		}
		f.mu.Lock()
		have := f.result != nil
		f.mu.Unlock()
		if have {
			continue
		}
		if err := h.readDraw(ctx, f); err != nil {
			h.m.resyncErrors.Inc()
			h.log.Warn().Err(err).Str("sku", f.sku).Msg("reading a draw's result failed; will retry")
		}
	}
}

// readDraw reads f's result; once applied, it tells every watcher.
func (h *Hub) readDraw(ctx context.Context, f *drawFeed) error {
	ctx, cancel := context.WithTimeout(ctx, max(h.cfg.ReadTimeout, 10*time.Second))
	defer cancel()
	go func() {
		select {
		case <-h.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	applied, entries, err := h.engine.Draws().AppliedResult(ctx, f.sku)
	if err != nil {
		return fmt.Errorf("reading the draw of %s: %w", f.sku, err)
	}
	if !applied {
		return nil
	}
	result := make(map[string]inventory.DrawEntry, len(entries))
	for _, e := range entries {
		result[e.Principal] = e
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.result = result
	for s := range f.subs {
		s.offer(result)
	}
	return nil
}

func (h *Hub) drawFeed(channel string) *drawFeed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dfeeds[channel]
}

// onDrawSubscribed re-reads a draw whose channel Redis confirmed (first, or
// again after a reconnect).
func (h *Hub) onDrawSubscribed(f *drawFeed) {
	f.mu.Lock()
	f.confirmed = true
	f.mu.Unlock()
	kick(f.kick)
}

// onDrawMessage takes the message that f's draw is applied.
func (h *Hub) onDrawMessage(f *drawFeed) { kick(f.kick) }

// sweepIdleDraws drops draw feeds without watchers for Linger; the control
// loop then unsubscribes their channels.
func (h *Hub) sweepIdleDraws(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c, f := range h.dfeeds {
		f.mu.Lock()
		if len(f.subs) == 0 && !f.idleSince.IsZero() && now.Sub(f.idleSince) >= h.cfg.Linger {
			delete(h.dfeeds, c)
			close(f.gone)
		}
		f.mu.Unlock()
	}
}
