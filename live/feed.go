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

	dirty     bool      // cur has not been delivered yet
	force     bool      // deliver cur even to subscribers that already have it
	scheduled bool      // a trailing flush is queued with the flusher
	due       time.Time // while scheduled: when that flush may go
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
	f.maybeFlush(h, h.now())
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
		f.maybeFlush(h, h.now())
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
	due := f.nextDue(h)
	if now.Before(due) {
		f.schedule(h, due)
		return
	}
	f.flush(h, now)
}

// nextDue is the earliest the feed may flush again: the gap after the
// previous flush when its fan-out is finished, else the Interval after it;
// never sooner than MinInterval after it (the gap is measured only when
// drained runs, which may be a moment after the fan-out finished).
func (f *feed) nextDue(h *Hub) time.Time {
	if f.owed.Load() != 0 {
		return f.lastFlush.Add(h.cfg.Interval)
	}
	return f.lastFlush.Add(max(f.gap, h.cfg.MinInterval))
}

// schedule queues the trailing flush for due, or moves a queued one there.
// The feed keeps due itself: the flusher may already hold a flush of the
// feed taken off its queue earlier, and flushDue goes by the feed's due.
func (f *feed) schedule(h *Hub, due time.Time) {
	f.scheduled, f.due = true, due
	h.scheduleFlush(f, due)
}

// drained is called when the last subscriber owing a value of the SKU
// handed it to its reader: the fan-out is finished. Its span sets the gap
// to the next flush, 4 times the span (so a SKU's fan-out takes at most a
// fifth of the time, however fast its changes come), never below
// MinInterval nor above Interval; a change waiting for it goes out when
// the gap has passed.
func (f *feed) drained(h *Hub) {
	now := h.now()
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
	due := f.nextDue(h)
	if now.Before(due) {
		f.schedule(h, due) // moves a queued Interval flush earlier
		return
	}
	if f.scheduled {
		h.unscheduleFlush(f)
		f.scheduled = false
	}
	f.flush(h, now)
}

// flushDue is the trailing flush, called by the flusher with a feed it took
// off its queue. Between the two the feed may have flushed by another path
// (drained) and queued a new flush for later: the feed's own due time then
// says the flush waits, and it is queued again for then.
func (f *feed) flushDue(h *Hub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.scheduled {
		return // flushed since by another path, nothing new
	}
	now := h.now()
	if now.Before(f.due) {
		h.scheduleFlush(f, f.due)
		return
	}
	f.scheduled = false
	if f.dirty {
		f.flush(h, now)
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
