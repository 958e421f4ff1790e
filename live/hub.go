package live

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
)

// ErrNotRunning is returned by Subscribe before Start or after Stop: a
// subscription needs the hub's goroutines to be fed and to be closed.
var ErrNotRunning = errors.New("live availability is not running")

// DefaultInterval is HubConfig.Interval's default.
const DefaultInterval = 100 * time.Millisecond

// HubConfig tunes the hub. Zero values take the defaults named on each field.
type HubConfig struct {
	// Interval is the longest a change of a SKU waits for the SKU's
	// previous fan-out to finish (every subscriber to hand the previous
	// value to its reader) before it is delivered anyway; changes in
	// between are coalesced and the last one is always delivered. Default
	// DefaultInterval.
	Interval time.Duration
	// MinInterval is the shortest time between two deliveries of one SKU;
	// the gap grows with the time the SKU's last fan-out took (4 times it),
	// up to Interval. Default Interval/5; at most Interval.
	MinInterval time.Duration
	// MaxSKUs caps the SKUs of one subscription; default 50.
	MaxSKUs int
	// StallTimeout is how long a subscriber may leave a value unread before it
	// is dropped (its channel closed), so that a dead client never holds
	// memory or a goroutine for ever. Default 30 seconds.
	StallTimeout time.Duration
	// ResyncInterval is how often every subscribed SKU is re-read from Redis,
	// so that a lost pub/sub message never leaves a subscriber stale at rest.
	// Default 5 seconds; negative disables it (reconnects still re-read).
	ResyncInterval time.Duration
	// Linger is how long the Redis subscription of a SKU outlives its last
	// local subscriber, so that a client that reconnects at once does not
	// cost an SSUBSCRIBE/SUNSUBSCRIBE pair. Default 1 second.
	Linger time.Duration
	// PingInterval is how long a pub/sub connection may stay silent before it
	// is pinged; a ping left unanswered for another interval makes the hub
	// reconnect. Default 5 seconds.
	PingInterval time.Duration
	// ReadTimeout bounds each re-read of stock from Redis; default 3 seconds.
	ReadTimeout time.Duration
	// QueuePollLinger is how long a queue that is only polled (QueueState)
	// stays watched after its last poll; default DefaultQueuePollLinger.
	QueuePollLinger time.Duration
}

func (c *HubConfig) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.MinInterval <= 0 {
		c.MinInterval = c.Interval / 5
	}
	c.MinInterval = min(c.MinInterval, c.Interval)
	if c.MaxSKUs <= 0 {
		c.MaxSKUs = 50
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 30 * time.Second
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = 5 * time.Second
	}
	if c.Linger <= 0 {
		c.Linger = time.Second
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 5 * time.Second
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 3 * time.Second
	}
	if c.QueuePollLinger <= 0 {
		c.QueuePollLinger = DefaultQueuePollLinger
	}
}

const (
	hubNew = iota
	hubRunning
)

// Hub fans stock changes out to local subscribers. One hub per process holds
// one Redis subscription per SKU channel however many clients watch that SKU,
// coalesces bursts per SKU, and never lets a slow client hold up anyone else.
// See the package documentation for the design and its limits.
//
// Stop (from startstop.Base) ends every subscription (their channels close),
// drops the Redis subscriptions and waits for the hub's goroutines, at most
// until its context ends. It is safe to call more than once and before Start.
type Hub struct {
	startstop.Base
	cfg    HubConfig
	engine *inventory.Engine
	rdb    redis.UniversalClient
	keys   inventory.Keys
	log    zerolog.Logger
	m      *metrics

	mu     sync.Mutex
	state  int
	done   <-chan struct{} // closed when the hub stops; nil until Start
	feeds  map[string]*feed
	qfeeds map[string]*queueFeed      // by channel
	dfeeds map[string]*drawFeed       // by channel
	resets [inventory.Partitions]bool // shards whose connection must be rebuilt
	wg     sync.WaitGroup

	queueReader QueueReader

	controlKick chan struct{}

	flushMu   sync.Mutex
	flushAt   map[*feed]time.Time
	flushKick chan struct{}
	// now is the clock of the pacing (time.Now; a test steps its own).
	now func() time.Time

	resyncMu   sync.Mutex
	resyncWant map[string]bool // SKU -> deliver even if unchanged
	// qresyncWant is resyncWant's twin for queues, by channel.
	qresyncWant map[string]bool
	resyncKick  chan struct{}

	// confirmed signals, to a test, each SKU whose Redis subscription Redis
	// confirmed (first, or again after a reconnect), once it is counted;
	// dropped, each stalled subscriber dropped.
	so soldOutState

	confirmed testsignal.Signal[string]
	dropped   testsignal.Signal[struct{}]
}

// NewHub builds a hub; Start runs it. The engine reads the true stock (and
// rebuilds a SKU Redis lost); rdb carries the sharded pub/sub subscriptions
// and may be a single node or a cluster client.
func NewHub(cfg HubConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Hub {
	cfg.setDefaults()
	return &Hub{
		cfg: cfg, engine: engine, rdb: rdb, keys: engine.Keys(),
		log: log.With().Str("component", "live").Logger(), m: newMetrics(reg),
		feeds:       map[string]*feed{},
		qfeeds:      map[string]*queueFeed{},
		dfeeds:      map[string]*drawFeed{},
		qresyncWant: map[string]bool{},
		controlKick: make(chan struct{}, 1),
		flushAt:     map[*feed]time.Time{},
		flushKick:   make(chan struct{}, 1),
		now:         time.Now,
		resyncWant:  map[string]bool{},
		resyncKick:  make(chan struct{}, 1),
		so:          soldOutState{f: map[string]*feed{}, add: map[string]*soldAdding{}, kick: make(chan struct{}, 1)},
	}
}

// Config returns the hub's settings with defaults filled in.
func (h *Hub) Config() HubConfig { return h.cfg }

// Start runs the hub's goroutines until ctx is done or Stop is called.
// Starting twice, or after the hub stopped, does nothing.
func (h *Hub) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != hubNew {
		return nil
	}
	ctx, finish, ok := h.StartInit(ctx)
	if !ok {
		return nil
	}
	h.state = hubRunning
	h.done = ctx.Done()
	h.wg.Add(4)
	h.so.run.Store(true)
	go h.runControl(ctx)
	go h.runFlusher(ctx)
	go h.runResync(ctx)
	go h.runSoldOut(ctx)
	go func() {
		<-ctx.Done()
		h.wg.Wait() // the loops and every subscriber
		finish(nil)
	}()
	return nil
}

// Subscribe watches the stock of skus. The channel first carries the current
// value of each SKU, then its changes: at once when the SKU's previous value
// has reached every subscriber, else the newest when it has (or when
// Interval has passed), the hub never handing it two within MinInterval
// (a reader that takes one late may take the next right after), and
// always the last one. It closes when ctx is done, when the hub stops, or
// when the reader leaves a value unread for StallTimeout.
//
// Errors: *inventory.InvalidInputError for an empty list, a malformed SKU or
// more than MaxSKUs; inventory.ErrNotFound when a SKU does not exist;
// inventory.ErrUnavailable when Redis cannot be read; ErrNotRunning.
func (h *Hub) Subscribe(ctx context.Context, skus []string) (<-chan inventory.Stock, error) {
	skus, err := h.checkSKUs(skus)
	if err != nil {
		return nil, err
	}
	if !h.running() {
		return nil, ErrNotRunning
	}
	// Read first, register after: an unknown SKU then costs no Redis
	// subscription. Nothing is missed in between: a SKU already subscribed
	// keeps receiving changes, and a new SKU is re-read as soon as Redis
	// confirms its subscription (see onSubscribed).
	gens := h.gensOf(skus)
	vals, err := h.engine.Catalog().StockMany(ctx, skus)
	if err != nil {
		return nil, fmt.Errorf("subscribing to stock: %w", err)
	}
	for i, v := range vals {
		if v == nil {
			return nil, fmt.Errorf("subscribing to stock: %w", &inventory.NotFoundError{Kind: "product", Key: skus[i]})
		}
	}

	s := newSubscriber(h, skus)
	feeds, created, ok := h.attach(s)
	if !ok {
		return nil, ErrNotRunning
	}
	if len(created) > 0 {
		kick(h.controlKick)
		// A new feed may replace one swept a moment ago whose channel never
		// left Redis (so no confirmation will come), and messages between the
		// sweep and now were dropped: re-read once more after attaching.
		for _, sku := range created {
			h.requestResync(sku, false)
		}
	}
	for i, f := range feeds {
		f.applyRead(h, *vals[i], gens[i], false)
		f.offerCurrent(s, i)
	}
	h.m.subscriptions.Inc()
	go s.run(ctx)
	return s.out, nil
}

func (h *Hub) checkSKUs(skus []string) ([]string, error) {
	if len(skus) == 0 {
		return nil, &inventory.InvalidInputError{Field: "skus", Reason: "must name at least one SKU"}
	}
	seen := make(map[string]struct{}, len(skus))
	out := make([]string, 0, len(skus))
	for _, sku := range skus {
		if !inventory.ValidSKU(sku) {
			return nil, &inventory.InvalidInputError{Field: "skus", Reason: "each must be 1-64 characters of A-Z a-z 0-9 . _ -"}
		}
		if _, dup := seen[sku]; dup {
			continue
		}
		seen[sku] = struct{}{}
		out = append(out, sku)
	}
	if len(out) > h.cfg.MaxSKUs {
		return nil, &inventory.InvalidInputError{Field: "skus", Reason: fmt.Sprintf("at most %d SKUs per subscription", h.cfg.MaxSKUs)}
	}
	return out, nil
}

func (h *Hub) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == hubRunning && !closed(h.done)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// gensOf snapshots the generation of each SKU's feed before a read is issued
// (0 for a SKU without a feed), so that applyRead can tell whether the feed
// learnt anything newer while the read was in flight.
func (h *Hub) gensOf(skus []string) []uint64 {
	gens := make([]uint64, len(skus))
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, sku := range skus {
		if f := h.feeds[sku]; f != nil {
			f.mu.Lock()
			gens[i] = f.gen
			f.mu.Unlock()
		}
	}
	return gens
}

// attach registers s with the feed of each of its SKUs, creating feeds as
// needed, and accounts for its goroutine while the hub is known to run.
func (h *Hub) attach(s *subscriber) (feeds []*feed, created []string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != hubRunning || closed(h.done) {
		return nil, nil, false
	}
	s.hubDone = h.done
	feeds = make([]*feed, len(s.slots))
	for i := range s.slots {
		sku := s.slots[i].sku
		f := h.feeds[sku]
		if f == nil {
			f = newFeed(sku, h.keys.Channel(sku))
			h.feeds[sku] = f
			h.m.skus.Inc()
			created = append(created, sku)
		}
		s.slots[i].feed = f // before a flush can offer it anything
		f.mu.Lock()
		f.subs[s] = i
		f.idleSince = time.Time{}
		f.mu.Unlock()
		feeds[i] = f
	}
	h.wg.Add(1)
	return feeds, created, true
}

// detach removes s from its feeds; a feed left without subscribers starts
// lingering and is unsubscribed by the control loop later.
func (h *Hub) detach(s *subscriber) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range s.slots {
		f := h.feeds[s.slots[i].sku]
		if f == nil {
			continue
		}
		f.mu.Lock()
		delete(f.subs, s)
		if len(f.subs) == 0 {
			f.idleSince = now
		}
		f.mu.Unlock()
	}
}

// feed returns the feed of a SKU, or nil.
func (h *Hub) feed(sku string) *feed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.feeds[sku]
}

// scheduleFlush asks the flusher to flush f at t.
func (h *Hub) scheduleFlush(f *feed, t time.Time) {
	h.flushMu.Lock()
	h.flushAt[f] = t
	h.flushMu.Unlock()
	kick(h.flushKick)
}

// unscheduleFlush forgets a queued flush of f (f.mu is held).
func (h *Hub) unscheduleFlush(f *feed) {
	h.flushMu.Lock()
	delete(h.flushAt, f)
	h.flushMu.Unlock()
}

// runFlusher delivers the trailing value of every SKU whose interval has
// ended. One goroutine and one timer serve all SKUs.
func (h *Hub) runFlusher(ctx context.Context) {
	defer h.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := h.now()
		due, next := h.takeDueFlushes(now)
		for _, f := range due {
			f.flushDue(h)
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = next.Sub(h.now())
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-h.flushKick:
		}
	}
}

// takeDueFlushes removes from the queue the feeds whose flush is due at now
// and returns them, with the earliest time still queued (zero if none).
// Another path may flush such a feed before the flusher gets to it; flushDue
// then finds the feed's own due time and waits for it.
func (h *Hub) takeDueFlushes(now time.Time) (due []*feed, next time.Time) {
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	for f, t := range h.flushAt {
		if !t.After(now) {
			due = append(due, f)
			delete(h.flushAt, f)
		} else if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return due, next
}

// requestResync queues a re-read of sku; force delivers the value to every
// subscriber even when it did not change (after a reconnect).
func (h *Hub) requestResync(sku string, force bool) {
	h.resyncMu.Lock()
	h.resyncWant[sku] = h.resyncWant[sku] || force
	h.resyncMu.Unlock()
	kick(h.resyncKick)
}

// resyncBatch bounds the SKUs of one StockMany call.
const resyncBatch = 256

// runResync re-reads queued SKUs in batches. A failed read is queued again
// with a growing pause, so a Redis outage neither spins nor loses a forced
// delivery.
func (h *Hub) runResync(ctx context.Context) {
	defer h.wg.Done()
	var ticker <-chan time.Time
	if h.cfg.ResyncInterval > 0 {
		t := time.NewTicker(h.cfg.ResyncInterval)
		defer t.Stop()
		ticker = t.C
	}
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.resyncKick:
		case <-ticker:
			h.resyncAll()
			h.resyncAllQueues()
			continue // resyncAll kicked; the next turn reads
		}
		h.resyncMu.Lock()
		want := h.resyncWant
		h.resyncWant = map[string]bool{}
		h.resyncMu.Unlock()
		skus := make([]string, 0, len(want))
		for sku := range want {
			skus = append(skus, sku)
		}
		failed := false
		for start := 0; start < len(skus); start += resyncBatch {
			batch := skus[start:min(start+resyncBatch, len(skus))]
			if err := h.resync(ctx, batch, want); err != nil {
				if ctx.Err() != nil {
					return
				}
				failed = true
				h.m.resyncErrors.Inc()
				h.log.Warn().Err(err).Int("skus", len(batch)).Msg("re-reading stock failed; will retry")
				for _, sku := range batch {
					h.requestResync(sku, want[sku])
				}
			}
		}
		if h.resyncQueues(ctx) {
			failed = true
		}
		if ctx.Err() != nil {
			return
		}
		if !failed {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 2*time.Second)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

// resyncAll queues every SKU that has local subscribers.
func (h *Hub) resyncAll() {
	h.mu.Lock()
	skus := make([]string, 0, len(h.feeds))
	for sku, f := range h.feeds {
		f.mu.Lock()
		if len(f.subs) > 0 {
			skus = append(skus, sku)
		}
		f.mu.Unlock()
	}
	h.mu.Unlock()
	if len(skus) == 0 {
		return
	}
	h.resyncMu.Lock()
	for _, sku := range skus {
		if _, queued := h.resyncWant[sku]; !queued {
			h.resyncWant[sku] = false
		}
	}
	h.resyncMu.Unlock()
	h.m.resyncs.WithLabelValues("periodic").Add(float64(len(skus)))
	kick(h.resyncKick)
}

// resync reads the true stock of skus and offers it to their feeds.
func (h *Hub) resync(ctx context.Context, skus []string, force map[string]bool) error {
	feeds := make([]*feed, len(skus))
	gens := make([]uint64, len(skus))
	h.mu.Lock()
	for i, sku := range skus {
		if f := h.feeds[sku]; f != nil {
			feeds[i] = f
			f.mu.Lock()
			gens[i] = f.gen
			f.mu.Unlock()
		}
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReadTimeout)
	defer cancel()
	vals, err := h.engine.Catalog().StockMany(ctx, skus)
	if err != nil {
		return err
	}
	for i, f := range feeds {
		if f == nil || vals[i] == nil {
			continue // gone since, or the product no longer exists
		}
		f.applyRead(h, *vals[i], gens[i], force[skus[i]])
	}
	return nil
}

// kick wakes a goroutine waiting on a 1-slot channel without ever blocking.
func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
