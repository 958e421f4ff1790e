package live

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/dropline/dropline/inventory/queue"
)

// Queues ride on the hub like stock. Each admission step that changes what a
// waiter sees announces the queue's state once, on the queue's sharded
// channel in its partition (queue.Channel); the hub holds one Redis
// subscription per watched queue on the partition's connection, and hands
// every message to every local subscriber's one-slot mailbox. A waiter works
// its position out itself (its number minus admittedThrough), so the message
// is the same for all of them: with the GraphQL layer's shared
// subscriptions, 10,000 websocket waiters of one queue cost the hub one
// subscriber and one execution per step.
//
// The hub also keeps the newest state of queues that are only polled
// (QueueState, behind myQueueTicket): a poll is answered from memory, and a
// queue nobody subscribes to nor polled for QueuePollLinger is dropped.
//
// Correctness comes from re-reading, as for stock: when a feed is made, when
// Redis confirms its channel (again, after a reconnect), every
// ResyncInterval, and after an unreadable message. Steps are at most one
// every 250 ms per queue, so there is no pacing: each message is delivered
// at once.

// QueueReader reads a queue's true state from Redis (queue.Service.State).
type QueueReader interface {
	State(ctx context.Context, r queue.Ref) (queue.State, error)
}

// SetQueueReader lets the hub serve queues; without a reader SubscribeQueue
// and QueueState answer ErrNotRunning.
func (h *Hub) SetQueueReader(r QueueReader) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queueReader = r
}

// queueFeed is the hub's view of one queue.
type queueFeed struct {
	ref     queue.Ref
	channel string

	mu        sync.Mutex
	subs      map[*queueSub]struct{}
	idleSince time.Time // when the last subscriber left (or the feed was made by a poll)
	polledAt  time.Time // the last QueueState of it
	cur       queue.State
	have      bool
	gen       uint64
	confirmed bool
}

// queueAnnouncement is what queue_publish in lib.lua sends.
type queueAnnouncement struct {
	Queue   string `json:"queue"`
	Status  string `json:"status"`
	Through *int64 `json:"through"`
	Waiting *int64 `json:"waiting"`
	Seq     *int64 `json:"seq"`
	At      *int64 `json:"at"`
}

// SubscribeQueue watches queue r: the channel first carries its current
// state, then each change an admission step announces (one message per
// step, the same for every waiter). It closes when ctx is done, the hub
// stops, or the reader leaves a value unread for StallTimeout.
//
// Errors: *inventory.NotFoundError when there is no such queue;
// inventory.ErrUnavailable when Redis or the ledger cannot be read;
// ErrNotRunning.
func (h *Hub) SubscribeQueue(ctx context.Context, r queue.Ref) (<-chan queue.State, error) {
	reader := h.queues()
	if reader == nil || !h.running() {
		return nil, ErrNotRunning
	}
	channel := queue.Channel(h.keys, r)
	gen := h.queueGen(channel)
	st, err := reader.State(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("subscribing to queue %s: %w", r, err)
	}
	s := &queueSub{h: h, out: make(chan queue.State), wake: make(chan struct{}, 1)}
	f, ok := h.attachQueue(r, channel, s, time.Time{})
	if !ok {
		return nil, ErrNotRunning
	}
	s.f = f
	f.applyRead(h, st, gen, false)
	f.offerCurrent(s)
	h.m.queueSubscriptions.Inc()
	go s.run(ctx)
	return s.out, nil
}

// QueueState is queue r's newest state this process knows: from memory
// when the hub watches the queue (a subscriber, or a poll within
// QueuePollLinger), else read from Redis once, after which the hub watches
// it. A poll is therefore answered without a Redis round trip, at most one
// admission step (plus the fan-out) behind; a lost message is repaired by
// the periodic re-read.
func (h *Hub) QueueState(ctx context.Context, r queue.Ref) (queue.State, error) {
	reader := h.queues()
	if reader == nil || !h.running() {
		return queue.State{}, ErrNotRunning
	}
	channel := queue.Channel(h.keys, r)
	now := time.Now()
	h.mu.Lock()
	f := h.qfeeds[channel]
	h.mu.Unlock()
	if f != nil {
		f.mu.Lock()
		f.polledAt = now
		st, have := f.cur, f.have
		f.mu.Unlock()
		if have {
			return st, nil
		}
	}
	gen := h.queueGen(channel)
	st, err := reader.State(ctx, r)
	if err != nil {
		return queue.State{}, fmt.Errorf("reading queue %s: %w", r, err)
	}
	if f, ok := h.attachQueue(r, channel, nil, now); ok {
		f.applyRead(h, st, gen, false)
	}
	return st, nil
}

func (h *Hub) queues() QueueReader {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.queueReader
}

func (h *Hub) queueFeed(channel string) *queueFeed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.qfeeds[channel]
}

func (h *Hub) queueGen(channel string) uint64 {
	if f := h.queueFeed(channel); f != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.gen
	}
	return 0
}

// attachQueue registers s (nil for a poll at polled) with the feed of r,
// creating it as needed; a created feed's channel is subscribed and the
// queue re-read once more after.
func (h *Hub) attachQueue(r queue.Ref, channel string, s *queueSub, polled time.Time) (*queueFeed, bool) {
	h.mu.Lock()
	if h.state != hubRunning || closed(h.done) {
		h.mu.Unlock()
		return nil, false
	}
	f := h.qfeeds[channel]
	created := f == nil
	if created {
		f = &queueFeed{ref: r, channel: channel, subs: map[*queueSub]struct{}{}, idleSince: time.Now()}
		h.qfeeds[channel] = f
		h.m.queues.Inc()
	}
	f.mu.Lock()
	if s != nil {
		s.hubDone = h.done
		f.subs[s] = struct{}{}
		f.idleSince = time.Time{}
		h.wg.Add(1)
	}
	if !polled.IsZero() {
		f.polledAt = polled
	}
	f.mu.Unlock()
	h.mu.Unlock()
	if created {
		kick(h.controlKick)
		h.requestQueueResync(channel, false)
	}
	return f, true
}

func (h *Hub) detachQueue(s *queueSub) {
	f := s.f
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.subs, s)
	if len(f.subs) == 0 {
		f.idleSince = time.Now()
	}
}

// DefaultQueuePollLinger is how long a queue that is only polled stays
// watched after its last poll.
const DefaultQueuePollLinger = 30 * time.Second

// sweepIdleQueues drops queue feeds without subscribers for Linger and
// without a poll for QueuePollLinger; the control loop then unsubscribes
// their channels.
func (h *Hub) sweepIdleQueues(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c, f := range h.qfeeds {
		f.mu.Lock()
		if len(f.subs) == 0 && !f.idleSince.IsZero() && now.Sub(f.idleSince) >= h.cfg.Linger &&
			now.Sub(f.polledAt) >= h.cfg.QueuePollLinger {
			delete(h.qfeeds, c)
			h.m.queues.Dec()
		}
		f.mu.Unlock()
	}
}

// requestQueueResync queues a re-read of the queue of channel.
func (h *Hub) requestQueueResync(channel string, force bool) {
	h.resyncMu.Lock()
	h.qresyncWant[channel] = h.qresyncWant[channel] || force
	h.resyncMu.Unlock()
	kick(h.resyncKick)
}

// resyncQueues re-reads the queues queued for it; failed ones are queued
// again. It reports whether any failed.
func (h *Hub) resyncQueues(ctx context.Context) bool {
	h.resyncMu.Lock()
	want := h.qresyncWant
	h.qresyncWant = map[string]bool{}
	h.resyncMu.Unlock()
	reader := h.queues()
	failed := false
	for channel, force := range want {
		f := h.queueFeed(channel)
		if f == nil || reader == nil {
			continue
		}
		gen := h.queueGen(channel)
		rctx, cancel := context.WithTimeout(ctx, h.cfg.ReadTimeout)
		st, err := reader.State(rctx, f.ref)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			failed = true
			h.m.resyncErrors.Inc()
			h.log.Warn().Err(err).Str("queue", f.ref.String()).Msg("re-reading a queue failed; will retry")
			h.requestQueueResync(channel, force)
			continue
		}
		f.applyRead(h, st, gen, force)
	}
	return failed
}

// resyncAllQueues queues every watched queue for a re-read.
func (h *Hub) resyncAllQueues() {
	h.mu.Lock()
	channels := make([]string, 0, len(h.qfeeds))
	for c := range h.qfeeds {
		channels = append(channels, c)
	}
	h.mu.Unlock()
	if len(channels) == 0 {
		return
	}
	h.resyncMu.Lock()
	for _, c := range channels {
		if _, queued := h.qresyncWant[c]; !queued {
			h.qresyncWant[c] = false
		}
	}
	h.resyncMu.Unlock()
	h.m.resyncs.WithLabelValues("periodic").Add(float64(len(channels)))
	kick(h.resyncKick)
}

// onQueueSubscribed re-reads a queue whose channel Redis confirmed; after a
// reconnect the state is delivered to every subscriber again.
func (h *Hub) onQueueSubscribed(f *queueFeed) {
	f.mu.Lock()
	again := f.confirmed
	f.confirmed = true
	f.mu.Unlock()
	reason := "subscribed"
	if again {
		reason = "reconnect"
	}
	h.m.resyncs.WithLabelValues(reason).Inc()
	h.requestQueueResync(f.channel, again)
}

// onQueueMessage takes an announcement of f's queue.
func (h *Hub) onQueueMessage(f *queueFeed, payload string) {
	h.m.queueReceived.Inc()
	var a queueAnnouncement
	if err := json.Unmarshal([]byte(payload), &a); err != nil || a.Queue != f.ref.String() || a.Status == "" ||
		a.Through == nil || a.Waiting == nil || a.Seq == nil || a.At == nil {
		h.m.dropped.WithLabelValues("invalid").Inc()
		h.requestQueueResync(f.channel, false)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.have {
		// No settings to go with it yet: the read under way brings them.
		h.requestQueueResync(f.channel, false)
		return
	}
	if *a.Seq <= f.cur.Seq {
		h.m.dropped.WithLabelValues("stale").Inc()
		return
	}
	st := f.cur
	st.Status, st.AdmittedThrough, st.Waiting, st.Seq = queue.Status(a.Status), *a.Through, *a.Waiting, *a.Seq
	if st.Status != queue.StatusPreQueue && st.Seed == nil {
		// The opening revealed the seed: a re-read brings it.
		h.requestQueueResync(f.channel, false)
	}
	f.set(h, st, time.UnixMilli(*a.At), false)
}

// applyRead takes a state read by a read issued at generation gen: accepted
// when newer (higher seq), or when the feed learnt nothing meanwhile and it
// differs (Redis lost the queue and it was loaded again).
func (f *queueFeed) applyRead(h *Hub, st queue.State, gen uint64, force bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.have, st.Seq > f.cur.Seq, f.gen == gen && !sameQueue(st, f.cur):
		f.set(h, st, time.Time{}, force)
	case st.Seq == f.cur.Seq && st.Seed != nil && f.cur.Seed == nil:
		f.set(h, st, time.Time{}, force) // the same step, with the seed revealed
	case force:
		f.set(h, f.cur, time.Time{}, true)
	}
}

// set makes st the feed's state and offers it to every subscriber; at is
// the announcement's time (zero for a read), for the delivery latency.
func (f *queueFeed) set(h *Hub, st queue.State, at time.Time, force bool) {
	f.cur, f.have = st, true
	f.gen++
	for s := range f.subs {
		s.offer(st, at, force)
	}
}

func (f *queueFeed) offerCurrent(s *queueSub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.have {
		s.offer(f.cur, time.Time{}, false)
	}
}

// sameQueue compares what a waiter sees of a queue.
func sameQueue(a, b queue.State) bool {
	return a.Seq == b.Seq && a.Status == b.Status && a.AdmittedThrough == b.AdmittedThrough &&
		a.Waiting == b.Waiting && (a.Seed == nil) == (b.Seed == nil)
}

// queueSub is one SubscribeQueue: a one-value mailbox the hub overwrites
// and never waits on, and a goroutine that hands it to the reader.
type queueSub struct {
	h       *Hub
	f       *queueFeed
	hubDone <-chan struct{}
	out     chan queue.State
	wake    chan struct{}

	mu      sync.Mutex
	pending bool
	val     queue.State
	at      time.Time
	last    queue.State
	hasLast bool
}

func (s *queueSub) offer(st queue.State, at time.Time, force bool) {
	s.mu.Lock()
	if !force && s.hasLast && sameQueue(s.last, st) {
		s.mu.Unlock()
		return
	}
	s.val, s.at, s.pending = st, at, true
	s.last, s.hasLast = st, true
	s.mu.Unlock()
	kick(s.wake)
}

func (s *queueSub) take() (queue.State, time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.pending {
		return queue.State{}, time.Time{}, false
	}
	s.pending = false
	return s.val, s.at, true
}

// run delivers the mailbox until ctx is done, the hub stops or the reader
// stalls for StallTimeout.
func (s *queueSub) run(ctx context.Context) {
	h := s.h
	defer h.wg.Done()
	defer close(s.out)
	defer h.m.queueSubscriptions.Dec()
	defer h.detachQueue(s)
	stall := time.NewTimer(h.cfg.StallTimeout)
	stall.Stop()
	defer stall.Stop()
	for {
		v, at, ok := s.take()
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
		stall.Reset(h.cfg.StallTimeout)
	wait:
		for {
			select {
			case s.out <- v:
				stall.Stop()
				h.m.queueDeliveries.Inc()
				if !at.IsZero() {
					h.m.queueLatency.Observe(max(time.Since(at), 0).Seconds())
				}
				break wait
			case <-s.wake:
				if nv, nat, ok := s.take(); ok {
					v, at = nv, nat
				}
			case <-stall.C:
				h.m.slowDropped.Inc()
				h.dropped.Signal(struct{}{})
				return
			case <-ctx.Done():
				return
			case <-s.hubDone:
				return
			}
		}
	}
}
