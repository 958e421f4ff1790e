package live

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory"
)

// The hub is the engine's memory of sold-out SKUs (inventory.SoldOutMemory):
// a reserve of a SKU this process knows has nothing available and nothing
// held is answered OUT_OF_STOCK without a script run. What it knows is the
// SKU's feed: the same announcements and re-reads that carry its stock to
// subscribers, so a restock, a cancel or anything else that gives units back
// reaches the memory as it reaches a watching browser.
//
// A SKU is watched once Redis has refused a reserve of it for want of stock
// (Refused), for soldOutWatch after the last reserve that asked for it. Its
// verdict holds only while all of these do:
//
//   - Redis confirmed the SKU's channel and the connection has not been lost
//     since: no announcement can have been missed;
//   - a read of the SKU's hash issued after that confirmation, and at most
//     soldOutTrust ago, is what the feed's value is or follows (the hub reads
//     every watched SKU every soldOutVerifyEvery, so a lost message, a silent
//     connection or a product change without an announcement is bounded too);
//   - the value says 0 available and 0 held (held units can come back: a
//     cancel, an expiry, a cart given up, a waitlist offer declined);
//   - the read found a SKU sold first come, without a per-person limit, of no
//     drop, inside its sale window with soldOutWindowMargin to spare: for
//     such a SKU Redis answers OUT_OF_STOCK to any buyer (the policy checks
//     the stock last);
//   - no restock, product update or rebuild by this process is in flight
//     (Adding), and a read was issued after the last one ended: a buyer
//     told by this process that a restock is done is never refused by its
//     stale memory.
//
// What another process restocks reaches this one with its announcement, a
// message from Redis that left when the restock ran; until it arrives (the
// pub/sub latency, under a millisecond on a quiet network), a reserve here is
// refused as if it had come just before the restock.
const (
	soldOutWatch        = 10 * time.Second
	soldOutVerifyEvery  = 200 * time.Millisecond
	soldOutTrust        = 500 * time.Millisecond
	soldOutWindowMargin = time.Second
)

// soldOutState is the hub's part of the memory.
type soldOutState struct {
	run  atomic.Bool // between Start and the end of runSoldOut
	mu   sync.RWMutex
	f    map[string]*feed       // the SKUs watched for the memory
	add  map[string]*soldAdding // restocks and the like in flight, by SKU
	kick chan struct{}
}

// soldAdding counts the additions of units to a SKU in flight here and when
// the last one ended.
type soldAdding struct {
	n   int
	end time.Time
}

// soldView is what the memory keeps of a watched SKU, on its feed.
type soldView struct {
	watchUntil time.Time // the SKU is watched until then
	verified   time.Time // when the last read that vouches for cur was issued
	confirms   uint64    // confirmations of the SKU's channel seen
	lost       bool      // the channel's connection was lost since its last confirmation
	plain      bool      // first come, no per-person limit, no drop
	starts     int64     // the sale window, ms (0: open)
	ends       int64
	gone       bool // the feed was removed from the hub
}

var _ inventory.SoldOutMemory = (*Hub)(nil)

func (s *soldOutState) running() bool { return s.run.Load() }

// SoldOut reports whether sku is known to have nothing available and nothing
// held, and a policy that answers every buyer OUT_OF_STOCK then (see above).
func (h *Hub) SoldOut(sku string) bool {
	h.so.mu.RLock()
	f := h.so.f[sku]
	var addEnd time.Time
	if a := h.so.add[sku]; a != nil {
		if a.n > 0 {
			h.so.mu.RUnlock()
			return false
		}
		addEnd = a.end
	}
	h.so.mu.RUnlock()
	if f == nil || !h.so.running() {
		return false
	}
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	v := &f.sold
	v.watchUntil = now.Add(soldOutWatch)
	if v.gone || v.lost || v.verified.IsZero() || now.Sub(v.verified) > soldOutTrust || !v.verified.After(addEnd) {
		return false
	}
	if !f.have || f.cur.Available != 0 || f.cur.Held != 0 || !v.plain {
		return false
	}
	ms, margin := now.UnixMilli(), soldOutWindowMargin.Milliseconds()
	return (v.starts == 0 || v.starts+margin <= ms) && (v.ends == 0 || ms+margin < v.ends)
}

// Refused starts watching sku (or keeps watching it): Redis refused a
// reserve of it for want of stock.
func (h *Hub) Refused(sku string) {
	if !h.so.running() {
		return
	}
	now := time.Now()
	h.so.mu.RLock()
	f := h.so.f[sku]
	h.so.mu.RUnlock()
	if f != nil {
		f.mu.Lock()
		gone := f.sold.gone
		if !gone {
			f.sold.watchUntil = now.Add(soldOutWatch)
		}
		f.mu.Unlock()
		if !gone {
			return
		}
	}
	created := false
	h.mu.Lock()
	if h.state != hubRunning || closed(h.done) {
		h.mu.Unlock()
		return
	}
	f = h.feeds[sku]
	if f == nil {
		f = newFeed(sku, h.keys.Channel(sku))
		f.idleSince = now // no subscriber: swept after the watch ends
		h.feeds[sku] = f
		h.m.skus.Inc()
		created = true
	}
	f.mu.Lock()
	f.sold.watchUntil = now.Add(soldOutWatch)
	f.mu.Unlock()
	h.so.mu.Lock()
	h.so.f[sku] = f
	h.so.mu.Unlock()
	h.mu.Unlock()
	if created {
		kick(h.controlKick)
	}
	kick(h.so.kick)
}

// Adding makes SoldOut answer false for sku until done is called and the SKU
// has been read again after it.
func (h *Hub) Adding(sku string) (done func()) {
	h.so.mu.Lock()
	a := h.so.add[sku]
	if a == nil {
		a = &soldAdding{}
		h.so.add[sku] = a
	}
	a.n++
	h.so.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.so.mu.Lock()
			a.n--
			a.end = time.Now()
			h.so.mu.Unlock()
			kick(h.so.kick)
		})
	}
}

// soldOutLost withdraws the verdicts of partition p's SKUs: their
// connection was lost, and announcements with it.
func (h *Hub) soldOutLost(p int) {
	h.so.mu.RLock()
	defer h.so.mu.RUnlock()
	for sku, f := range h.so.f {
		if h.keys.PartitionOf(sku) != p {
			continue
		}
		f.mu.Lock()
		f.sold.lost, f.sold.verified = true, time.Time{}
		f.mu.Unlock()
	}
}

// soldOutConfirmed records a (re)confirmation of f's channel.
func (h *Hub) soldOutConfirmed(f *feed) {
	f.mu.Lock()
	f.sold.confirms++
	f.sold.lost = false
	watched := f.sold.watchUntil.After(time.Now())
	f.mu.Unlock()
	if watched {
		kick(h.so.kick)
	}
}

// soldOutFields are read from each watched SKU's hash.
var soldOutFields = []string{"total", "avail", "held", "sold", "seq", "upd", "mode", "max", "start", "end", "drop"}

// runSoldOut re-reads the watched SKUs every soldOutVerifyEvery (and when
// kicked), and stops watching those nobody asked for in soldOutWatch.
func (h *Hub) runSoldOut(ctx context.Context) {
	defer h.wg.Done()
	defer h.so.run.Store(false)
	t := time.NewTicker(soldOutVerifyEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.so.kick:
		}
		h.verifySoldOut(ctx)
	}
}

// soldRead is one watched SKU's read in flight.
type soldRead struct {
	f        *feed
	gen      uint64
	confirms uint64
	cmd      *redis.SliceCmd
}

func (h *Hub) verifySoldOut(ctx context.Context) {
	now := time.Now()
	var reads []*soldRead
	var dropped []*feed
	h.so.mu.Lock()
	for sku, a := range h.so.add {
		if a.n == 0 && now.Sub(a.end) > soldOutTrust {
			delete(h.so.add, sku)
		}
	}
	for sku, f := range h.so.f {
		f.mu.Lock()
		switch {
		case f.sold.gone || !f.sold.watchUntil.After(now):
			delete(h.so.f, sku)
			dropped = append(dropped, f)
		case f.confirmed && !f.sold.lost:
			reads = append(reads, &soldRead{f: f, gen: f.gen, confirms: f.sold.confirms})
		}
		f.mu.Unlock()
	}
	h.so.mu.Unlock()
	if len(dropped) > 0 {
		// A feed nobody subscribes to starts lingering, and is swept.
		h.mu.Lock()
		for _, f := range dropped {
			f.mu.Lock()
			if len(f.subs) == 0 && f.idleSince.IsZero() {
				f.idleSince = now
			}
			f.mu.Unlock()
		}
		h.mu.Unlock()
	}
	if len(reads) == 0 {
		return
	}
	issued := time.Now()
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReadTimeout)
	defer cancel()
	_, _ = h.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range reads {
			r.cmd = p.HMGet(ctx, h.keys.SKU(r.f.sku), soldOutFields...)
		}
		return nil
	})
	for _, r := range reads {
		vals, err := r.cmd.Result()
		if err != nil || len(vals) != len(soldOutFields) || vals[0] == nil {
			// Unreadable, or a SKU Redis does not have: nothing to vouch for.
			r.f.mu.Lock()
			r.f.sold.verified = time.Time{}
			r.f.mu.Unlock()
			continue
		}
		str := func(i int) string { s, _ := vals[i].(string); return s }
		num := func(i int) int64 { n, _ := strconv.ParseInt(str(i), 10, 64); return n }
		s := inventory.Stock{SKU: r.f.sku, Total: int(num(0)), Available: int(max(num(1), 0)), Held: int(num(2)),
			Sold: int(num(3)), Seq: num(4), UpdatedAt: time.UnixMilli(num(5)).UTC()}
		r.f.applyRead(h, s, r.gen, false)
		mode := str(6)
		r.f.mu.Lock()
		if r.f.confirmed && !r.f.sold.lost && r.f.sold.confirms == r.confirms {
			v := &r.f.sold
			v.verified = issued
			v.plain = (mode == "" || mode == "first_come") && num(7) == 0 && str(10) == ""
			v.starts, v.ends = num(8), num(9)
		} else {
			r.f.sold.verified = time.Time{}
		}
		r.f.mu.Unlock()
	}
}
