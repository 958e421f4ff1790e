package live

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory"
)

// shard is the pub/sub connection of one key partition. Every channel of a
// partition carries the partition's hash tag, hence one cluster slot, hence
// one node: a single connection carries them all, on a cluster as on a
// single Redis. A process thus holds at most inventory.Partitions pub/sub
// connections, however many SKUs and clients it serves.
type shard struct {
	p      int
	ps     *redis.PubSub
	closed chan struct{}

	// subscribed is what was asked of Redis; only the control loop uses it.
	subscribed map[string]struct{}

	mu sync.Mutex
	// unsubPending counts SUNSUBSCRIBEs not yet confirmed, to tell our own
	// confirmations from the server dropping a channel (a slot moved).
	unsubPending map[string]int
}

func (sh *shard) close() {
	close(sh.closed)
	_ = sh.ps.Close()
}

func (sh *shard) isClosed() bool { return closed(sh.closed) }

// expectUnsub records that we asked to leave channels.
func (sh *shard) expectUnsub(channels []string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, c := range channels {
		sh.unsubPending[c]++
	}
}

// confirmUnsub consumes one expected confirmation; false means the server
// unsubscribed us on its own.
func (sh *shard) confirmUnsub(channel string) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.unsubPending[channel] == 0 {
		return false
	}
	if sh.unsubPending[channel]--; sh.unsubPending[channel] == 0 {
		delete(sh.unsubPending, channel)
	}
	return true
}

// connectionLost forgets expected confirmations: a new connection starts
// with only the channels still wanted.
func (sh *shard) connectionLost() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	clear(sh.unsubPending)
}

// controlOpTimeout bounds one SSUBSCRIBE/SUNSUBSCRIBE write (and its dial).
const controlOpTimeout = 5 * time.Second

// runControl owns the shards: it subscribes channels of new feeds, drops
// feeds that lingered long enough without subscribers, unsubscribes their
// channels, and rebuilds connections the receivers found broken.
func (h *Hub) runControl(ctx context.Context) {
	defer h.wg.Done()
	var shards [inventory.Partitions]*shard
	defer func() {
		for _, sh := range shards {
			if sh != nil {
				sh.close()
			}
		}
	}()
	sweep := time.NewTicker(min(max(h.cfg.Linger/2, 10*time.Millisecond), time.Second))
	defer sweep.Stop()
	for {
		h.reconcile(ctx, &shards)
		select {
		case <-ctx.Done():
			return
		case <-h.controlKick:
		case <-sweep.C:
			h.sweepIdle()
		}
	}
}

// sweepIdle removes feeds that have had no subscriber for Linger.
func (h *Hub) sweepIdle() {
	now := time.Now()
	h.sweepIdleQueues(now)
	h.sweepIdleDraws(now)
	var gone []*feed
	h.mu.Lock()
	for sku, f := range h.feeds {
		f.mu.Lock()
		if len(f.subs) == 0 && !f.idleSince.IsZero() && now.Sub(f.idleSince) >= h.cfg.Linger &&
			!f.sold.watchUntil.After(now) {
			delete(h.feeds, sku)
			f.sold.gone = true
			gone = append(gone, f)
		}
		f.mu.Unlock()
	}
	h.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	h.m.skus.Sub(float64(len(gone)))
	h.flushMu.Lock()
	for _, f := range gone {
		delete(h.flushAt, f)
	}
	h.flushMu.Unlock()
}

// reconcile makes each shard's Redis subscriptions match the feeds.
func (h *Hub) reconcile(ctx context.Context, shards *[inventory.Partitions]*shard) {
	var want [inventory.Partitions]map[string]struct{}
	h.mu.Lock()
	for _, f := range h.feeds {
		p := h.keys.PartitionOf(f.sku)
		if want[p] == nil {
			want[p] = map[string]struct{}{}
		}
		want[p][f.channel] = struct{}{}
	}
	for c, f := range h.qfeeds {
		p := f.ref.Partition()
		if want[p] == nil {
			want[p] = map[string]struct{}{}
		}
		want[p][c] = struct{}{}
	}
	for c, f := range h.dfeeds {
		p := h.keys.PartitionOf(f.sku)
		if want[p] == nil {
			want[p] = map[string]struct{}{}
		}
		want[p][c] = struct{}{}
	}
	resets := h.resets
	h.resets = [inventory.Partitions]bool{}
	h.mu.Unlock()
	if ctx.Err() != nil {
		return
	}

	for p := range shards {
		sh := shards[p]
		if sh != nil && (resets[p] || len(want[p]) == 0) {
			sh.close()
			shards[p], sh = nil, nil
		}
		if len(want[p]) == 0 {
			continue
		}
		opCtx, cancel := context.WithTimeout(ctx, controlOpTimeout)
		if sh == nil {
			shards[p] = h.openShard(ctx, opCtx, p, want[p])
			cancel()
			continue
		}
		var added, removed []string
		for c := range want[p] {
			if _, ok := sh.subscribed[c]; !ok {
				added = append(added, c)
				sh.subscribed[c] = struct{}{}
			}
		}
		for c := range sh.subscribed {
			if _, ok := want[p][c]; !ok {
				removed = append(removed, c)
				delete(sh.subscribed, c)
			}
		}
		// A failed write is not lost: go-redis remembers the channels and
		// subscribes them again when the receiver reconnects.
		if len(added) > 0 {
			if err := sh.ps.SSubscribe(opCtx, added...); err != nil {
				h.log.Debug().Err(err).Int("partition", p).Msg("SSUBSCRIBE deferred to reconnect")
			}
		}
		if len(removed) > 0 {
			sh.expectUnsub(removed)
			if err := sh.ps.SUnsubscribe(opCtx, removed...); err != nil {
				h.log.Debug().Err(err).Int("partition", p).Msg("SUNSUBSCRIBE deferred to reconnect")
			}
		}
		cancel()
	}
}

// openShard opens partition p's connection subscribed to channels (within
// opCtx) and starts its receiver (for the hub's lifetime ctx).
func (h *Hub) openShard(ctx, opCtx context.Context, p int, channels map[string]struct{}) *shard {
	list := make([]string, 0, len(channels))
	sub := make(map[string]struct{}, len(channels))
	for c := range channels {
		list = append(list, c)
		sub[c] = struct{}{}
	}
	// SSubscribe routes the connection to the node owning the channels' slot
	// (on a cluster) and remembers them for every reconnect.
	sh := &shard{p: p, ps: h.rdb.SSubscribe(opCtx, list...), closed: make(chan struct{}),
		subscribed: sub, unsubPending: map[string]int{}}
	h.wg.Add(1)
	go h.receive(ctx, sh)
	return sh
}

// requestReset asks the control loop to rebuild partition p's connection.
func (h *Hub) requestReset(p int) {
	h.mu.Lock()
	h.resets[p] = true
	h.mu.Unlock()
	h.soldOutLost(p)
	kick(h.controlKick)
}

// receive reads one shard's connection until it is closed. go-redis
// reconnects and re-subscribes on its own; every subscription Redis confirms
// makes the hub re-read that SKU, which is how a gap is closed.
func (h *Hub) receive(ctx context.Context, sh *shard) {
	defer h.wg.Done()
	log := h.log.With().Int("partition", sh.p).Logger()
	var backoff time.Duration
	down, awaitingPong := false, false
	for {
		msg, err := sh.ps.ReceiveTimeout(ctx, h.cfg.PingInterval)
		if sh.isClosed() {
			return
		}
		if err != nil {
			if isTimeout(err) {
				if awaitingPong {
					log.Warn().Msg("pub/sub connection did not answer a ping; reconnecting")
					h.requestReset(sh.p)
					awaitingPong = false
					continue
				}
				awaitingPong = sh.ps.Ping(ctx) == nil
				continue
			}
			if !down {
				down = true
				log.Warn().Err(err).Msg("pub/sub connection lost; reconnecting")
			}
			sh.connectionLost()
			h.soldOutLost(sh.p)
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
			select {
			case <-sh.closed:
				return
			case <-time.After(backoff):
			}
			continue
		}
		if down {
			down = false
			h.m.reconnects.Inc()
			log.Info().Msg("pub/sub connection back")
		}
		backoff, awaitingPong = 0, false
		switch m := msg.(type) {
		case *redis.Message:
			h.onMessage(m)
		case *redis.Subscription:
			switch m.Kind {
			case "ssubscribe":
				h.onSubscribed(m.Channel)
			case "sunsubscribe":
				if !sh.confirmUnsub(m.Channel) && h.watches(m.Channel) {
					log.Warn().Str("channel", m.Channel).Msg("Redis dropped a subscription (slot moved?); reconnecting")
					h.requestReset(sh.p)
				}
			}
		}
	}
}

// watches reports whether a channel is still wanted: a SKU's or a queue's.
func (h *Hub) watches(channel string) bool {
	if h.queueFeed(channel) != nil || h.drawFeed(channel) != nil {
		return true
	}
	f := h.feed(h.skuOf(channel))
	return f != nil && f.channel == channel
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// skuOf returns the SKU a channel announces: SKUs contain no colon, so it is
// what follows the last one.
func (h *Hub) skuOf(channel string) string {
	return channel[strings.LastIndexByte(channel, ':')+1:]
}

// onSubscribed re-reads a SKU whose subscription Redis just confirmed. The
// first confirmation closes the window between a new subscriber's snapshot
// and the subscription going live; a later one follows a reconnect, during
// which messages were lost, so the value is delivered again to everyone.
func (h *Hub) onSubscribed(channel string) {
	if qf := h.queueFeed(channel); qf != nil {
		h.onQueueSubscribed(qf)
		return
	}
	if df := h.drawFeed(channel); df != nil {
		h.onDrawSubscribed(df)
		return
	}
	sku := h.skuOf(channel)
	f := h.feed(sku)
	if f == nil || f.channel != channel {
		return
	}
	f.mu.Lock()
	again := f.confirmed
	f.confirmed = true
	f.mu.Unlock()
	h.soldOutConfirmed(f)
	reason := "subscribed"
	if again {
		reason = "reconnect"
	}
	h.m.resyncs.WithLabelValues(reason).Inc()
	h.confirmed.Signal(sku)
	h.requestResync(sku, again)
}

// announcement is the payload lua/lib.lua's announce publishes. Numbers are
// pointers so a missing field (a SKU Redis no longer has) is told from zero.
// seq is read as an integer: it can pass 2^53, beyond which a float64 would
// make two changes one value and drop the second as stale.
type announcement struct {
	SKU       string   `json:"sku"`
	Total     *float64 `json:"total"`
	Available *float64 `json:"available"`
	Held      *float64 `json:"held"`
	Sold      *float64 `json:"sold"`
	Seq       *int64   `json:"seq"`
	At        *float64 `json:"at"`
}

func (h *Hub) onMessage(m *redis.Message) {
	if qf := h.queueFeed(m.Channel); qf != nil {
		h.onQueueMessage(qf, m.Payload)
		return
	}
	if df := h.drawFeed(m.Channel); df != nil {
		h.onDrawMessage(df)
		return
	}
	h.m.received.Inc()
	sku := h.skuOf(m.Channel)
	f := h.feed(sku)
	if f == nil || f.channel != m.Channel {
		return // a channel being unsubscribed
	}
	var a announcement
	if err := json.Unmarshal([]byte(m.Payload), &a); err != nil || a.SKU != sku ||
		a.Total == nil || a.Available == nil || a.Held == nil || a.Sold == nil || a.Seq == nil || a.At == nil {
		h.m.dropped.WithLabelValues("invalid").Inc()
		h.requestResync(sku, false)
		return
	}
	f.applyMessage(h, inventory.Stock{
		SKU: sku, Total: int(*a.Total), Available: int(*a.Available), Held: int(*a.Held), Sold: int(*a.Sold),
		Seq: *a.Seq, UpdatedAt: time.UnixMilli(int64(*a.At)).UTC(),
	})
}
