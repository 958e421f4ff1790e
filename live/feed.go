package live

import (
	"sync"
	"time"

	"github.com/dropline/dropline/inventory"
)

// feed is the hub's view of one SKU: its newest known stock, the local
// subscribers watching it, and the pacing of deliveries to them.
type feed struct {
	sku     string
	channel string

	mu        sync.Mutex
	subs      map[*subscriber]int // subscriber -> index of this SKU in its slots
	idleSince time.Time           // when the last subscriber left; zero while watched

	cur  inventory.Stock
	have bool
	// live is true when cur is a change seen as it happened (a message, or a
	// re-read that found a change), so its UpdatedAt measures delivery delay.
	live bool
	// gen counts the values accepted into cur; a read issued at generation g
	// that returns with gen still g is the freshest thing known.
	gen uint64

	dirty     bool // cur has not been delivered yet
	force     bool // deliver cur even to subscribers that already have it
	scheduled bool // a trailing flush is queued with the flusher
	lastFlush time.Time

	// confirmed is set when Redis first confirms the SKU's subscription; a
	// later confirmation means the connection was rebuilt, so messages may
	// have been lost.
	confirmed bool

	// sold is what the sold-out memory keeps of the SKU (soldout.go).
	sold soldView
}

func newFeed(sku, channel string) *feed {
	return &feed{sku: sku, channel: channel, subs: map[*subscriber]int{}}
}

// applyMessage takes a value announced on the channel. Messages older than
// what the feed knows (lower seq) are dropped.
func (f *feed) applyMessage(h *Hub, s inventory.Stock) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.have && s.Seq <= f.cur.Seq {
		h.m.dropped.WithLabelValues("stale").Inc()
		return
	}
	f.set(h, s, true)
	f.maybeFlush(h, time.Now())
}

// applyRead takes a value read from Redis by a read issued when the feed was
// at generation gen. It is accepted when it is newer (higher seq) or when the
// feed learnt nothing while the read was in flight: then it is the truth,
// even with a lower seq (Redis lost the SKU and rebuilt it). force delivers
// the feed's value to every subscriber even when nothing changed.
func (f *feed) applyRead(h *Hub, s inventory.Stock, gen uint64, force bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.have:
		f.set(h, s, false)
	case s.Seq > f.cur.Seq || (f.gen == gen && !sameStock(s, f.cur)):
		f.set(h, s, true)
	case force:
		f.live = false // the same old value again: its age is not a delay
	}
	if force {
		f.force, f.dirty = true, true
	}
	if f.dirty {
		f.maybeFlush(h, time.Now())
	}
}

func (f *feed) set(h *Hub, s inventory.Stock, live bool) {
	if f.dirty && f.have {
		h.m.coalesced.WithLabelValues("sku").Inc()
	}
	f.cur, f.have, f.live = s, true, live
	f.gen++
	f.dirty = true
}

// maybeFlush delivers at once when the SKU's interval has passed (the
// leading edge of a burst) and otherwise queues the trailing flush.
func (f *feed) maybeFlush(h *Hub, now time.Time) {
	if f.scheduled {
		return
	}
	if next := f.lastFlush.Add(h.cfg.Interval); now.Before(next) {
		f.scheduled = true
		h.scheduleFlush(f, next)
		return
	}
	f.flush(h, now)
}

// flushDue is the trailing flush, called by the flusher.
func (f *feed) flushDue(h *Hub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scheduled = false
	if f.dirty {
		f.flush(h, time.Now())
	}
}

// flush hands cur to every subscriber's mailbox. It never blocks: a mailbox
// holds one value per SKU and is overwritten.
func (f *feed) flush(h *Hub, now time.Time) {
	for s, i := range f.subs {
		s.offer(i, f.cur, f.live, f.force)
	}
	f.dirty, f.force = false, false
	f.lastFlush = now
}

// offerCurrent gives a new subscriber the feed's current value.
func (f *feed) offerCurrent(s *subscriber, i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.have {
		s.offer(i, f.cur, false, false)
	}
}

// sameStock reports whether two values describe the same state.
func sameStock(a, b inventory.Stock) bool {
	return a.Seq == b.Seq && a.Available == b.Available && a.Held == b.Held && a.Sold == b.Sold && a.Total == b.Total
}
