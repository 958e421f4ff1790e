package live

import (
	"context"
	"sync"
	"time"

	"github.com/dropline/dropline/inventory"
)

// subscriber is one Subscribe call: a mailbox with one slot per SKU, which
// the hub overwrites and never waits on, and a goroutine that moves the
// mailbox into the caller's channel at the caller's pace.
type subscriber struct {
	h       *Hub
	hubDone <-chan struct{}
	out     chan inventory.Stock
	wake    chan struct{}

	mu    sync.Mutex
	slots []slot
	next  int // round-robin start, so one busy SKU cannot starve the others
}

// slot is the mailbox of one SKU.
type slot struct {
	sku     string
	pending bool
	val     inventory.Stock
	live    bool
	// last is the value most recently put in the mailbox, so the same value
	// offered twice (a flush and a snapshot) is delivered once.
	last    inventory.Stock
	hasLast bool
	// owed says a value was offered that the reader has not been handed
	// yet (pending, or in the goroutine's hand); feed counts it in its
	// owed, so that it knows when its fan-out is finished.
	owed bool
	feed *feed
}

func newSubscriber(h *Hub, skus []string) *subscriber {
	s := &subscriber{h: h, out: make(chan inventory.Stock), wake: make(chan struct{}, 1),
		slots: make([]slot, len(skus))}
	for i, sku := range skus {
		s.slots[i].sku = sku
	}
	return s
}

// offer puts v in the mailbox of SKU i, replacing any value not yet taken.
func (s *subscriber) offer(i int, v inventory.Stock, live, force bool) {
	s.mu.Lock()
	sl := &s.slots[i]
	if !force && sl.hasLast && sameStock(sl.last, v) {
		s.mu.Unlock()
		return
	}
	if sl.pending {
		s.h.m.coalesced.WithLabelValues("subscriber").Inc()
	}
	sl.val, sl.live, sl.pending = v, live, true
	sl.last, sl.hasLast = v, true
	if !sl.owed && sl.feed != nil {
		sl.owed = true
		sl.feed.owed.Add(1)
	}
	s.mu.Unlock()
	kick(s.wake)
}

// take removes one pending value from the mailbox, visiting SKUs in turn.
func (s *subscriber) take() (int, inventory.Stock, bool, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.slots)
	for k := 0; k < n; k++ {
		i := (s.next + k) % n
		if sl := &s.slots[i]; sl.pending {
			sl.pending = false
			s.next = (i + 1) % n
			return i, sl.val, sl.live, true
		}
	}
	return 0, inventory.Stock{}, false, false
}

// takeSlot removes the pending value of SKU i, if there is one.
func (s *subscriber) takeSlot(i int) (inventory.Stock, bool, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := &s.slots[i]
	if !sl.pending {
		return inventory.Stock{}, false, false
	}
	sl.pending = false
	return sl.val, sl.live, true
}

// settle is called when the reader was handed a value of SKU i: unless a
// newer one is pending, the subscriber owes its feed nothing more, and the
// last one to settle tells the feed its fan-out is finished.
func (s *subscriber) settle(i int) {
	s.mu.Lock()
	sl := &s.slots[i]
	f := sl.feed
	done := sl.owed && !sl.pending
	if done {
		sl.owed = false
	}
	s.mu.Unlock()
	if done && f.owed.Add(-1) == 0 {
		f.drained(s.h)
	}
}

// settleAll releases whatever the subscriber still owes, when it leaves.
func (s *subscriber) settleAll() {
	for i := range s.slots {
		s.mu.Lock()
		sl := &s.slots[i]
		f := sl.feed
		done := sl.owed
		sl.owed, sl.pending = false, false
		s.mu.Unlock()
		if done && f.owed.Add(-1) == 0 {
			f.drained(s.h)
		}
	}
}

// run delivers the mailbox until ctx (the caller's) is done, the hub stops or
// the caller stalls; then it leaves the feeds and closes the channel.
func (s *subscriber) run(ctx context.Context) {
	h := s.h
	defer h.wg.Done()
	defer close(s.out)
	defer h.m.subscriptions.Dec()
	defer s.settleAll()
	defer h.detach(s)

	stall := time.NewTimer(h.cfg.StallTimeout)
	stall.Stop()
	defer stall.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		i, v, live, ok := s.take()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-s.hubDone:
				return
			case <-s.wake:
				continue
			}
		}
		select {
		case s.out <- v:
			s.delivered(v, live)
			s.settle(i)
			continue
		default:
		}
		// The reader is busy: wait for it, keep the value in hand fresh, and
		// give up on it after StallTimeout.
		stall.Reset(h.cfg.StallTimeout)
	wait:
		for {
			select {
			case s.out <- v:
				stall.Stop()
				s.delivered(v, live)
				s.settle(i)
				break wait
			case <-s.wake:
				// A newer value of the SKU in hand replaces it. Values of
				// other SKUs stay in the mailbox: take finds them after this
				// delivery without needing another wake-up.
				if nv, nlive, ok := s.takeSlot(i); ok {
					h.m.coalesced.WithLabelValues("subscriber").Inc()
					v, live = nv, nlive
				}
			case <-stall.C:
				s.stalled()
				return
			case <-ctx.Done():
				return
			case <-s.hubDone:
				return
			}
		}
	}
}

func (s *subscriber) delivered(v inventory.Stock, live bool) {
	s.h.m.deliveries.Inc()
	if live && !v.UpdatedAt.IsZero() {
		s.h.m.latency.Observe(max(time.Since(v.UpdatedAt), 0).Seconds())
	}
}

func (s *subscriber) stalled() {
	s.h.m.slowDropped.Inc()
	s.h.dropped.Signal(struct{}{})
	s.h.log.Debug().Int("skus", len(s.slots)).Dur("stall_timeout", s.h.cfg.StallTimeout).
		Msg("dropping a subscriber that stopped reading")
}
