package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
)

// Outbox is the write-behind outbox of every partition as one consumer of
// one consumer group reads it: the only code that knows the streams' format
// on the reading side (the scripts append to them, lua/lib.lua emit).
//
// Reads never block and are grouped (XREADGROUP), so an entry stays pending
// on its consumer until it is acknowledged; a missing group (a new stream,
// or Redis lost its data) is created at the start of the stream and the read
// retried, and acknowledging into a stream Redis lost is not an error. Every
// entry is decoded into a db.Event here, and checked with db.Event.Validate.
type Outbox struct {
	rdb      redis.UniversalClient
	keys     Keys
	group    string
	consumer string
	run      script.Runner // runs ack_applied.lua
	log      zerolog.Logger
}

// Outbox returns the outbox as consumer of group reads it.
func (m *Maintenance) Outbox(group, consumer string) *Outbox {
	e := m.e
	return &Outbox{rdb: e.rdb, keys: e.keys, group: group, consumer: consumer, run: e.run,
		log: e.log.With().Str("owner", consumer).Logger()}
}

// OutboxEntry is one outbox entry, decoded.
type OutboxEntry struct {
	// ID is the entry's stream id; its time part is Redis' clock when the
	// entry was appended.
	ID string
	// Event is the ledger event the entry carries; set only when Err is nil.
	Event db.Event
	// Traceparent is the W3C traceparent of the request that caused the
	// event, when it was traced (reserve.lua's tp field); "" otherwise.
	Traceparent string
	// Err is why the entry cannot be applied: it does not decode, or its
	// event fails db.Event.Validate (db.ErrUnknownKind for a kind this
	// version does not know, e.g. written by a newer version mid-upgrade;
	// ErrNewerEvent for an entry of a newer EventVersion).
	Err error
	// fields are the entry's values as they were, kept for a dead letter.
	fields map[string]any
}

func decodeEntries(msgs []redis.XMessage) []OutboxEntry {
	out := make([]OutboxEntry, len(msgs))
	for i, m := range msgs {
		ev, err := ParseEvent(m)
		if err == nil {
			err = ev.Validate()
		}
		if err != nil {
			ev = db.Event{}
		}
		tp, _ := m.Values["tp"].(string)
		out[i] = OutboxEntry{ID: m.ID, Event: ev, Err: err, Traceparent: tp, fields: m.Values}
	}
	return out
}

// ParseEvent decodes one outbox stream entry into a ledger event. Fields it
// does not know are ignored; an entry whose version ("v", absent from an
// entry of version 1) is newer than EventVersion is refused with
// ErrNewerEvent.
func ParseEvent(m redis.XMessage) (db.Event, error) {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	num := func(k string) int64 { n, _ := strconv.ParseInt(str(k), 10, 64); return n }
	if v, ok := m.Values["v"]; ok {
		n, err := strconv.Atoi(str("v"))
		switch {
		case err != nil || n < 1:
			return db.Event{}, fmt.Errorf("outbox entry %s is malformed: version %v", m.ID, v)
		case n > EventVersion:
			return db.Event{}, fmt.Errorf("outbox entry %s: %w: version %d, this release reads up to %d", m.ID, ErrNewerEvent, n, EventVersion)
		}
	}
	ev := db.Event{
		ID: str("id"), Kind: str("type"), Token: str("tok"), SKU: str("sku"), Principal: str("who"),
		Quantity: int(num("qty")), ExpiresAt: msTime(num("exp")), CreatedAt: msTime(num("ctd")),
		At: msTime(num("at")), IdempotencyHash: str("idem"), RequestHash: str("fp"), Gen: str("gen"),
		Extensions: int(num("ext")),
		Seq:        num("wseq"), HoldMillis: num("hold"),
	}
	if db.IsQueueKind(ev.Kind) {
		// An admission queue's event names its queue, not a SKU (lib.lua's
		// emit_queue); Validate checks each kind's fields.
		ev.Queue, ev.Number, ev.First, ev.Last, ev.Nonce = str("q"), num("num"), num("first"), num("last"), str("nonce")
		if list := str("list"); list != "" {
			if err := json.Unmarshal([]byte(list), &ev.Principals); err != nil {
				return db.Event{}, fmt.Errorf("outbox entry %s is malformed: %w", m.ID, err)
			}
		}
		if ev.ID == "" || ev.Queue == "" {
			return db.Event{}, fmt.Errorf("outbox entry %s is malformed", m.ID)
		}
		return ev, nil
	}
	if db.IsWaitlistKind(ev.Kind) {
		// A waitlist entry is named by its SKU and seq; only an offer has a token.
		if ev.ID == "" || ev.SKU == "" || ev.Seq <= 0 || ev.Quantity <= 0 {
			return db.Event{}, fmt.Errorf("outbox entry %s is malformed", m.ID)
		}
		return ev, nil
	}
	if ev.ID == "" || ev.Token == "" || ev.SKU == "" || ev.Quantity <= 0 {
		return db.Event{}, fmt.Errorf("outbox entry %s is malformed", m.ID)
	}
	return ev, nil
}

// Read returns up to n entries of partition p never delivered to the group.
func (o *Outbox) Read(ctx context.Context, p, n int) ([]OutboxEntry, error) {
	return o.read(ctx, p, ">", n)
}

// ReadMany is Read for several partitions in one round trip (a pipeline,
// which a cluster client sends to each partition's node): up to n new
// entries of each of ps, and each partition's error, by partition. A
// partition whose group is missing is read again alone by Read, which
// creates it.
func (o *Outbox) ReadMany(ctx context.Context, ps []int, n int) (map[int][]OutboxEntry, map[int]error) {
	cmds := make([]*redis.XStreamSliceCmd, len(ps))
	_, _ = o.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, p := range ps {
			cmds[i] = pipe.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: o.group, Consumer: o.consumer, Streams: []string{o.keys.Outbox(p), ">"},
				Count: int64(n), Block: -1, // -1: no BLOCK argument
			})
		}
		return nil
	})
	entries := make(map[int][]OutboxEntry, len(ps))
	var errs map[int]error
	for i, p := range ps {
		res, err := cmds[i].Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil && isNoGroup(err):
			entries[p], err = o.Read(ctx, p, n)
		case err != nil:
			err = fmt.Errorf("reading outbox of partition %d: %w", p, err)
		case len(res) > 0 && len(res[0].Messages) > 0:
			entries[p] = decodeEntries(res[0].Messages)
		}
		if err != nil {
			if errs == nil {
				errs = map[int]error{}
			}
			errs[p] = err
		}
	}
	return entries, errs
}

// ReadPending returns up to n entries of partition p delivered to this
// consumer and not acknowledged: what it read before a crash or a failure.
func (o *Outbox) ReadPending(ctx context.Context, p, n int) ([]OutboxEntry, error) {
	return o.read(ctx, p, "0", n)
}

// ReadOwnPending returns up to n entries of partition p pending on this
// consumer for which skip (given the entry id) is false, read without
// touching the others: an entry is looked at with XPENDING, which leaves its
// idle time alone, and only those not skipped are taken again (XCLAIM to
// this consumer). Entries a read delivered whose reply never arrived are
// found this way while the ones skipped (refused by Postgres, retried once
// idle long enough to be claimed) keep aging.
func (o *Outbox) ReadOwnPending(ctx context.Context, p, n int, skip func(id string) bool) ([]OutboxEntry, error) {
	stream := o.keys.Outbox(p)
	pend, err := o.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: stream, Group: o.group, Consumer: o.consumer, Start: "-", End: "+", Count: int64(n),
	}).Result()
	if isNoGroup(err) || errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing pending events of partition %d: %w", p, err)
	}
	var ids []string
	for _, e := range pend {
		if !skip(e.ID) {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	msgs, err := o.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: o.group, Consumer: o.consumer, Messages: ids}).Result()
	if isNoGroup(err) || errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading pending events of partition %d: %w", p, err)
	}
	return decodeEntries(msgs), nil
}

func (o *Outbox) read(ctx context.Context, p int, id string, n int) ([]OutboxEntry, error) {
	stream := o.keys.Outbox(p)
	for attempt := 0; ; attempt++ {
		res, err := o.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: o.group, Consumer: o.consumer, Streams: []string{stream, id},
			Count: int64(n), Block: -1, // -1: no BLOCK argument
		}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, nil
		case err != nil && isNoGroup(err) && attempt == 0:
			if err := o.createGroup(ctx, p); err != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("reading outbox of partition %d: %w", p, err)
		}
		if len(res) == 0 {
			return nil, nil
		}
		return decodeEntries(res[0].Messages), nil
	}
}

// createGroup creates the consumer group at the start of the stream (so
// events written before it, e.g. by a rebuild right after a flush, are
// read), and the stream itself when missing.
func (o *Outbox) createGroup(ctx context.Context, p int) error {
	err := o.rdb.XGroupCreateMkStream(ctx, o.keys.Outbox(p), o.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("creating consumer group on partition %d: %w", p, err)
	}
	if err == nil {
		o.log.Info().Int("partition", p).Msg("created the outbox consumer group")
	}
	return nil
}

func isNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

// Ack acknowledges entries of partition p, so they are never delivered
// again and may be trimmed.
func (o *Outbox) Ack(ctx context.Context, p int, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	err := o.rdb.XAck(ctx, o.keys.Outbox(p), o.group, ids...).Err()
	if err != nil && !isNoGroup(err) { // NOGROUP: Redis lost the stream; nothing to acknowledge
		return fmt.Errorf("acknowledging partition %d: %w", p, err)
	}
	return nil
}

// AckApplied acknowledges entries of partition p, whose events are in
// order, right after the ledger applied those events, in one round trip
// (ack_applied.lua) when none of their SKUs was rebuilt since the events were
// written: Engine.ReconcileApplied would then change nothing. It returns
// false, acknowledging nothing, when one was: the caller runs
// ReconcileApplied, then Ack.
func (o *Outbox) AckApplied(ctx context.Context, p int, events []db.Event, ids []string) (bool, error) {
	if len(ids) == 0 {
		return true, nil
	}
	skus, gens := generationsOf(events)
	for _, sku := range skus {
		o.keys.PlaceAt(sku, p) // the batch is of this partition's outbox
	}
	acked, err := script.RunAckApplied(ctx, o.run, o.keys, script.AckApplied{Partition: p, Group: o.group, SKUs: skus,
		Generations: gens, IDs: ids})
	if err != nil {
		return false, fmt.Errorf("acknowledging partition %d: %w", p, err)
	}
	return acked, nil
}

// Claim takes over up to n entries of partition p pending on any consumer
// for at least minIdle (a dead process, or an event Postgres refused),
// scanning from start ("0-0" first). next is where the following call goes
// on; "0-0" or "" when the scan is over.
func (o *Outbox) Claim(ctx context.Context, p int, minIdle time.Duration, start string, n int) (entries []OutboxEntry, next string, err error) {
	msgs, next, err := o.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: o.keys.Outbox(p), Group: o.group, Consumer: o.consumer,
		MinIdle: minIdle, Start: start, Count: int64(n),
	}).Result()
	if isNoGroup(err) || errors.Is(err, redis.Nil) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("claiming pending events of partition %d: %w", p, err)
	}
	return decodeEntries(msgs), next, nil
}

// Trim removes the entries of partition p below id; pass
// OutboxState.TrimBelow, below which everything is acknowledged.
func (o *Outbox) Trim(ctx context.Context, p int, below string) error {
	if err := o.rdb.XTrimMinID(ctx, o.keys.Outbox(p), below).Err(); err != nil {
		return fmt.Errorf("trimming outbox of partition %d: %w", p, err)
	}
	return nil
}

// DeadLetter is an outbox entry set aside, and why.
type DeadLetter struct {
	Entry OutboxEntry
	// Reason is a short label, e.g. "malformed" or "refused".
	Reason string
	Err    error
}

// DeadLetter moves entries out of the way of the flow: each is appended to
// partition p's dead-letter stream (Keys.DeadLetters) with its fields as
// they were plus dead_entry (its outbox id), dead_reason and dead_error, and
// acknowledged, in one MULTI (both keys share the partition's hash tag), so
// an entry is never both dropped and not recorded. An operator can put an
// entry back in the outbox once it can be applied (docs/operations.md); the
// apply is idempotent on the event id.
func (o *Outbox) DeadLetter(ctx context.Context, p int, dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	ids := make([]string, len(dead))
	for i, d := range dead {
		ids[i] = d.Entry.ID
	}
	_, err := o.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, d := range dead {
			vals := make(map[string]any, len(d.Entry.fields)+3)
			for k, v := range d.Entry.fields {
				vals[k] = v
			}
			vals["dead_entry"], vals["dead_reason"], vals["dead_error"] = d.Entry.ID, d.Reason, d.Err.Error()
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: o.keys.DeadLetters(p), Values: vals})
		}
		pipe.XAck(ctx, o.keys.Outbox(p), o.group, ids...)
		return nil
	})
	if err != nil && !isNoGroup(err) { // NOGROUP: Redis lost the stream; nothing to acknowledge
		return fmt.Errorf("dead-lettering on partition %d: %w", p, err)
	}
	return nil
}

// Clock is Redis' clock, the one entry ids are stamped with; compare
// OutboxState.Oldest with it.
func (o *Outbox) Clock(ctx context.Context) (time.Time, error) {
	now, err := o.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("reading Redis time: %w", err)
	}
	return now, nil
}

// OutboxState is what the group has and has not applied of one partition's
// outbox.
type OutboxState struct {
	// Backlog counts entries not yet acknowledged: pending plus not yet
	// delivered.
	Backlog int64
	// Oldest is when the oldest unacknowledged entry was appended (Redis'
	// clock); zero when there is none.
	Oldest time.Time
	// TrimBelow is an id below which every entry is acknowledged; "" when
	// nothing may be trimmed.
	TrimBelow string
	// DeadLetters is the length of the partition's dead-letter stream.
	DeadLetters int64
}

// Lag is how long the oldest unacknowledged entry has waited at now (Redis'
// clock, see Outbox.Clock); 0 when none waits.
func (s OutboxState) Lag(now time.Time) time.Duration {
	if s.Oldest.IsZero() {
		return 0
	}
	return max(now.Sub(s.Oldest), 0)
}

// State reads what the group has and has not applied of partition p.
func (o *Outbox) State(ctx context.Context, p int) (OutboxState, error) {
	stream := o.keys.Outbox(p)
	dead, err := o.rdb.XLen(ctx, o.keys.DeadLetters(p)).Result()
	if err != nil {
		return OutboxState{}, fmt.Errorf("reading dead letters of partition %d: %w", p, err)
	}
	groups, err := o.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return OutboxState{DeadLetters: dead}, nil
		}
		return OutboxState{}, fmt.Errorf("reading outbox group of partition %d: %w", p, err)
	}
	var g *redis.XInfoGroup
	for i := range groups {
		if groups[i].Name == o.group {
			g = &groups[i]
		}
	}
	if g == nil {
		return OutboxState{DeadLetters: dead}, nil
	}
	s := OutboxState{DeadLetters: dead}
	var oldest string
	if g.Pending > 0 {
		pend, err := o.rdb.XPending(ctx, stream, o.group).Result()
		if err != nil {
			return OutboxState{}, fmt.Errorf("reading pending events of partition %d: %w", p, err)
		}
		oldest, s.TrimBelow = pend.Lower, pend.Lower
	} else if g.LastDeliveredID != "0-0" {
		s.TrimBelow = g.LastDeliveredID
	}
	undelivered := g.Lag
	if undelivered != 0 && oldest == "" {
		next, err := o.rdb.XRangeN(ctx, stream, "("+g.LastDeliveredID, "+", 1).Result()
		if err != nil {
			return OutboxState{}, fmt.Errorf("reading outbox of partition %d: %w", p, err)
		}
		if len(next) > 0 {
			oldest = next[0].ID
		}
	}
	if undelivered < 0 { // Redis cannot tell; count what is past the last delivery
		n, err := o.rdb.XLen(ctx, stream).Result()
		if err != nil {
			return OutboxState{}, fmt.Errorf("reading outbox length of partition %d: %w", p, err)
		}
		undelivered = max(n-g.Pending, 0)
	}
	s.Backlog = g.Pending + undelivered
	if oldest != "" {
		s.Oldest = time.UnixMilli(idMillis(oldest))
	}
	return s, nil
}

// idMillis is the creation time (Redis clock, ms) in a stream entry id.
func idMillis(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}
