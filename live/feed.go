package live

import (
	"sync"
	"sync/atomic"
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

	// Self-clocking (see maybeFlush). owed counts the subscribers that
	// were offered a value of the SKU and have not yet handed it to their
	// reader; when it falls to zero the last fan-out is finished, and
	// fanning says a flush is waiting for that (so its span is measured).
	// gap is the least time between two flushes that the last fan-out's
	// span asks for.
	owed    atomic.Int64
	fanning bool
	gap     time.Duration

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

// maybeFlush delivers cur now or queues it. Pacing is self-clocked: a
// change goes out at once when the SKU's previous fan-out is finished
// (every subscriber handed the previous value to its reader) and at least
// the gap since the previous flush has passed; a change that comes sooner
// is coalesced with any later ones and goes out, the newest, as soon as
// both hold (drained), or at the latest Interval after the previous flush,
// even if a subscriber still holds the previous value (a slow reader holds
// up nobody for longer than the Interval).
func (f *feed) maybeFlush(h *Hub, now time.Time) {
	if f.scheduled {
		return
	}
	due := f.lastFlush.Add(h.cfg.Interval)
	if f.owed.Load() == 0 {
		due = f.lastFlush.Add(f.gap)
	}
	if now.Before(due) {
		f.scheduled = true
		h.scheduleFlush(f, due)
		return
	}
	f.flush(h, now)
}

// drained is called when the last subscriber owing a value of the SKU
// handed it to its reader: the fan-out is finished. Its span sets the gap
// to the next flush, 4 times the span (so a SKU's fan-out takes at most a
// fifth of the time, however fast its changes come), never below
// MinInterval nor above Interval; a change waiting for it goes out when
// the gap has passed.
func (f *feed) drained(h *Hub) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owed.Load() != 0 {
		return // offered again since
	}
	if f.fanning {
		f.fanning = false
		f.gap = min(max(4*now.Sub(f.lastFlush), h.cfg.MinInterval), h.cfg.Interval)
	}
	if !f.dirty {
		return
	}
	due := f.lastFlush.Add(f.gap)
	if now.Before(due) {
		f.scheduled = true
		h.scheduleFlush(f, due) // moves a queued Interval flush earlier
		return
	}
	if f.scheduled {
		h.unscheduleFlush(f)
		f.scheduled = false
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
	f.fanning = true
	if f.owed.Load() == 0 {
		// Nobody was offered anything (no subscriber, or all had the
		// value): the fan-out is over already.
		f.fanning = false
		f.gap = h.cfg.MinInterval
	}
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
