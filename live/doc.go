// Package live is Dropline's live availability: it turns the stock
// announcements of the inventory scripts into a stream of values per
// subscriber, for any number of local subscribers, without letting a burst of
// changes or a slow client hurt anyone. It knows nothing of GraphQL or
// websockets; a transport calls Hub.Subscribe and forwards the channel.
//
// # Fan-out
//
//	Lua script ──SPUBLISH──▶ dl:{p07}:avail:<sku>     (sharded channel, one per SKU)
//	                               │  one SSUBSCRIBE per channel per process
//	                               ▼
//	shard p07 (one pub/sub connection per partition, ≤ 16 per process)
//	                               │  receive goroutine: parse, drop if seq <= known
//	                               ▼
//	feed <sku>: newest value, seq, pacing ──flush (self-clocked)──▶ mailboxes
//	                                                                     │ overwrite, never wait
//	subscriber: 1 slot per SKU + goroutine ──send at the reader's pace──▶ <-chan inventory.Stock
//
// Every channel of a partition shares the partition's hash tag, hence one
// cluster slot and one node, so a partition's channels ride on one
// connection on a Redis Cluster as on a single Redis. A channel is subscribed
// when the first local subscriber of its SKU arrives and unsubscribed when
// the last one has been gone for Linger (1 s), so a client that reconnects
// does not churn subscriptions.
//
// # Pacing and the last value
//
// Per SKU, pacing is self-clocked: a change goes out at once when the SKU's
// previous fan-out is finished, that is when every subscriber has handed the
// previous value to its reader (a feed counts the subscribers that still owe
// one). A change that comes while the fan-out is still going is coalesced
// with any later ones, and the newest goes out as soon as the fan-out
// finishes. Two bounds keep this from saturating a small machine or waiting
// on one slow reader:
//
//   - a minimum gap between two flushes of a SKU: 4 times the time its last
//     fan-out took (so a SKU's fan-out runs at most a fifth of the time,
//     however fast it changes), never less than MinInterval (Interval/5,
//     20 ms by default) and never more than Interval;
//   - Interval (100 ms by default) as the upper bound: a change waits at most
//     Interval after the previous flush even when a subscriber has not taken
//     the previous value yet (its mailbox slot is overwritten, as always).
//
// The last value is therefore always delivered, at most Interval after the
// change plus the fan-out time, and at once for a SKU whose subscribers keep
// up. A GraphQL subscription shared by thousands of clients is one
// subscriber of the hub, which takes each value in a fraction of a
// millisecond, so a hot SKU's changes reach the transport as they come; the
// transport's own writers coalesce per connection (server/graphql). Pacing
// is per SKU: a subscription of 50 SKUs may receive 50 values at once. The
// server takes the Interval from its configuration
// (config.Config.LiveInterval). A trailing flush (a change that must wait)
// is queued with one flusher goroutine for all SKUs.
//
// # Never blocking on a client
//
// The hub only ever writes into a subscriber's mailbox: one slot per SKU,
// overwritten by newer values (so memory per subscriber is bounded by its
// SKUs, never by the rate of changes). The subscriber's own goroutine moves
// the mailbox into its channel at the reader's pace, swapping the value in
// hand for a newer one while it waits. A reader that leaves a value unread
// for StallTimeout (30 s) is dropped: its channel closes and the drop is
// counted, and the transport is expected to end that client's subscription.
//
// # Correctness comes from re-reading
//
// Pub/sub is a hint, never the truth. The truth is re-read with
// Engine.StockMany (which rebuilds a SKU Redis lost, from Postgres):
//
//   - when a subscription is made (the first value of each SKU);
//   - when Redis confirms a channel's subscription: the first confirmation
//     closes the window between that snapshot and the subscription going
//     live; a later one means go-redis rebuilt the connection, messages may
//     be lost, and the value is delivered to every subscriber again, even if
//     unchanged;
//   - when a feed is created (it may replace one swept while its channel
//     stayed subscribed);
//   - every ResyncInterval (5 s) for every watched SKU, so a message lost
//     without a disconnect leaves nobody stale at rest for longer than that;
//   - after an unreadable announcement.
//
// Ordering: a message whose seq is not above the feed's is dropped (stale).
// A re-read is accepted when its seq is higher, or when the feed learnt
// nothing while the read was in flight (the feed's generation did not move):
// then it is the freshest truth there is, even with a lower seq. That is how
// the hub follows a rebuilt SKU whose seq went down (see below).
//
// A pub/sub connection that stays silent for PingInterval is pinged; an
// unanswered ping, or Redis unsubscribing a channel on its own (a slot moved
// to another node), makes the control loop rebuild the connection, which
// again ends in confirmations and re-reads.
//
// # Limits, stated honestly
//
//   - Convergence within 250 ms (G8) holds while pub/sub delivers. A message
//     lost without the connection dropping is repaired by the periodic
//     resync: up to ResyncInterval late.
//   - The seq of a SKU restarts at the rebuild's time in ms. If a SKU saw
//     more changes than milliseconds passed since its previous rebuild, the
//     new seq is lower than the old one; the hub drops the new messages as
//     stale until a re-read adopts the new value (the reconnect that usually
//     accompanies a rebuild, or the periodic resync).
//   - One goroutine per subscription (the price of a channel API that never
//     blocks the hub): about 6 KiB each, measured by TestHotSKUFanout and
//     BenchmarkHubFanout. The GraphQL layer makes one subscription for any
//     number of identical client subscriptions (server/graphql, shared
//     subscriptions), so a hot SKU's browsers cost the hub one.
//   - Fan-out is CPU work proportional to subscribers x deliveries: 2,000
//     subscribers of one SKU that all keep up, at the 20 ms minimum gap, are
//     up to 100,000 sends a second; the gap grows with the fan-out's own
//     span (4 times it), so a large fan-out paces itself towards Interval. A
//     much smaller Interval saturates a small machine; see the figures in
//     TestHotSKUFanout.
//   - Delivery latency is measured from the announcement's timestamp, taken
//     from Redis's clock in whole milliseconds, to the send: clock skew
//     between Redis and this process shows up in the histogram.
//   - The control loop writes SSUBSCRIBE/SUNSUBSCRIBE itself; an unreachable
//     Redis delays new channel subscriptions by up to 5 s per attempt (new
//     subscribers still get their first value, and re-reads catch up).
//   - Subscribe reads Redis first: while Redis is down it fails with
//     inventory.ErrUnavailable rather than waiting.
package live
