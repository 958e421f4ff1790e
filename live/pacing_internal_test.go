package live

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// pacing drives one feed with one subscriber on a clock the test steps,
// without Redis and without the hub's goroutines: the test plays the
// flusher (flusher), the reader (read) and the pub/sub messages (change),
// in exactly the order it wants.
type pacing struct {
	t     *testing.T
	h     *Hub
	f     *feed
	s     *subscriber
	clock time.Time
	seq   int64
	// flushes are the times a new value was handed to the subscriber.
	flushes []time.Time
}

func newPacing(t *testing.T, cfg HubConfig) *pacing {
	cfg.setDefaults()
	p := &pacing{t: t, clock: time.Unix(1_000_000, 0)}
	p.h = &Hub{cfg: cfg, m: newMetrics(prometheus.NewRegistry()),
		flushAt: map[*feed]time.Time{}, flushKick: make(chan struct{}, 1),
		now: func() time.Time { return p.clock }}
	p.f = newFeed("PACED", "PACED")
	p.s = newSubscriber(p.h, []string{"PACED"})
	p.s.slots[0].feed = p.f
	p.f.subs[p.s] = 0
	return p
}

func (p *pacing) step(d time.Duration) { p.clock = p.clock.Add(d) }

// offered is the seq of the value in the subscriber's mailbox (or in its
// hand), 0 before any.
func (p *pacing) offered() int64 {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.s.slots[0].last.Seq
}

// change announces the next value of the SKU, as a message would.
func (p *pacing) change() {
	p.seq++
	p.observe(func() { p.f.applyMessage(p.h, inventory.Stock{SKU: "PACED", Available: int(1000 - p.seq), Seq: p.seq}) })
}

// read hands the pending value to the reader, as the subscriber's goroutine
// does, and returns its seq.
func (p *pacing) read() int64 {
	var v inventory.Stock
	p.observe(func() {
		i, got, _, ok := p.s.take()
		require.True(p.t, ok, "nothing to read")
		v = got
		p.s.settle(i)
	})
	return v.Seq
}

// flusher runs the flushes taken off the queue; take is takeDueFlushes'
// answer, possibly from an earlier moment.
func (p *pacing) flusher(taken []*feed) {
	p.observe(func() {
		for _, f := range taken {
			f.flushDue(p.h)
		}
	})
}

// observe runs fn and records a flush when it handed the subscriber a new
// value.
func (p *pacing) observe(fn func()) {
	before := p.offered()
	fn()
	if p.offered() != before {
		p.flushes = append(p.flushes, p.clock)
	}
}

// requireMinGaps checks that no two flushes were within MinInterval.
func (p *pacing) requireMinGaps() {
	for i := 1; i < len(p.flushes); i++ {
		require.GreaterOrEqual(p.t, p.flushes[i].Sub(p.flushes[i-1]), p.h.cfg.MinInterval,
			"flushes %d and %d of the SKU within MinInterval (flushes at %v)", i-1, i, p.flushes)
	}
}

// TestTrailingFlushTakenBeforeADrainedFlushWaits: the flusher takes a
// SKU's Interval flush off its queue; before it runs it, the slow reader
// takes the previous value, so the end of the fan-out flushes the waiting
// change itself, and a new change comes and queues a flush of its own. The
// flush the flusher holds must not deliver that new change within
// MinInterval; the change still goes out by the Interval.
func TestTrailingFlushTakenBeforeADrainedFlushWaits(t *testing.T) {
	const interval, minInterval = 100 * time.Millisecond, 20 * time.Millisecond
	p := newPacing(t, HubConfig{Interval: interval, MinInterval: minInterval})

	p.change() // a quiet SKU: out at once
	require.EqualValues(t, 1, p.offered())
	p.step(10 * time.Millisecond)
	p.change() // waits for the reader, or the Interval
	require.EqualValues(t, 1, p.offered())

	p.step(interval - 10*time.Millisecond)
	taken, _ := p.h.takeDueFlushes(p.clock)
	require.Equal(t, []*feed{p.f}, taken, "the Interval flush is due")
	require.EqualValues(t, 1, p.read()) // the fan-out ends: 2 goes out at once
	require.EqualValues(t, 2, p.offered())

	p.step(time.Millisecond)
	p.change()
	p.flusher(taken) // the flush taken before the fan-out ended
	require.EqualValues(t, 2, p.offered(), "a stale trailing flush delivered a change within MinInterval")

	// Nobody reads: the newest still goes out one Interval after the last
	// flush, as with a fixed interval.
	p.step(interval - time.Millisecond - time.Nanosecond)
	taken, _ = p.h.takeDueFlushes(p.clock)
	p.flusher(taken)
	require.EqualValues(t, 2, p.offered())
	p.step(time.Nanosecond)
	taken, _ = p.h.takeDueFlushes(p.clock)
	p.flusher(taken)
	require.EqualValues(t, 3, p.offered(), "the last value was not delivered an Interval after the last flush")
	p.requireMinGaps()
}

// TestChangeBeforeTheFirstDrainWaitsMinInterval: the first fan-out of a
// SKU ends (its only subscriber settles) and a change comes before the
// feed has heard of the end (drained waits for the feed's lock). The
// change must not go out within MinInterval of the first flush although
// no fan-out span has set the gap yet.
func TestChangeBeforeTheFirstDrainWaitsMinInterval(t *testing.T) {
	const interval, minInterval = 100 * time.Millisecond, 20 * time.Millisecond
	p := newPacing(t, HubConfig{Interval: interval, MinInterval: minInterval})

	p.change()
	require.EqualValues(t, 1, p.offered())
	p.step(time.Millisecond)
	// The reader takes 1 and its subscriber settles up to the point where it
	// calls drained, which is still waiting for the feed's lock.
	_, _, _, ok := p.s.take()
	require.True(t, ok)
	p.s.mu.Lock()
	p.s.slots[0].owed = false
	p.s.mu.Unlock()
	require.Zero(t, p.f.owed.Add(-1))
	p.change() // holds the lock first
	p.observe(func() { p.f.drained(p.h) })
	require.EqualValues(t, 1, p.offered(), "a change went out within MinInterval of the first flush")

	p.step(minInterval - time.Millisecond)
	taken, _ := p.h.takeDueFlushes(p.clock)
	p.flusher(taken)
	require.EqualValues(t, 2, p.offered(), "the change did not go out MinInterval after the first flush")
	p.requireMinGaps()
}

// TestPacedSKUKeepsItsBounds steps a SKU through changes, reads and flusher
// turns in a fixed pseudo-random order, the flusher sometimes running what
// it took a step earlier: no two flushes within MinInterval, and a newest
// value not out yet always has a flush queued for the Interval after the
// previous flush at the latest.
func TestPacedSKUKeepsItsBounds(t *testing.T) {
	const interval, minInterval = 100 * time.Millisecond, 20 * time.Millisecond
	for seed := uint64(1); seed <= 200; seed++ {
		p := newPacing(t, HubConfig{Interval: interval, MinInterval: minInterval})
		x := seed
		rnd := func(n uint64) uint64 { // xorshift: the same run for a seed
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			return x % n
		}
		var held []*feed
		for range 300 {
			p.step(time.Duration(rnd(15)) * time.Millisecond)
			switch rnd(4) {
			case 0:
				p.change()
			case 1:
				p.s.mu.Lock()
				pending := p.s.slots[0].pending
				p.s.mu.Unlock()
				if pending {
					p.read()
				}
			case 2:
				p.flusher(held)
				held, _ = p.h.takeDueFlushes(p.clock)
			case 3:
				p.flusher(held)
				held = nil
				taken, _ := p.h.takeDueFlushes(p.clock)
				p.flusher(taken)
			}
			if p.offered() != p.seq {
				// The newest waits: a flush of it is queued (or in the
				// flusher's hand) for the Interval after the last at the latest.
				p.h.flushMu.Lock()
				at, queued := p.h.flushAt[p.f]
				p.h.flushMu.Unlock()
				require.True(t, queued || len(held) > 0, "seed %d: the newest value has no flush queued", seed)
				if queued {
					require.LessOrEqual(t, at.Sub(p.flushes[len(p.flushes)-1]), interval,
						"seed %d: the newest value is queued for later than the Interval", seed)
				}
			}
		}
		p.requireMinGaps()
	}
}
