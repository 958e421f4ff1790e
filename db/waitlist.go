package db

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statuses of a waitlist entry.
const (
	WaitWaiting = "WAITING"
	WaitOffered = "OFFERED"
	WaitLeft    = "LEFT"
)

// The outbox event kinds of the waitlist. A join carries the entry; a leave
// and an offer name it by (SKU, Seq), and an offer carries the token of the
// HELD reservation it handed over (whose own reserve event comes with it).
const (
	KindWaitJoin  = "wjoin"
	KindWaitLeave = "wleave"
	KindWaitOffer = "woffer"
)

var waitKindStatus = map[string]string{KindWaitJoin: WaitWaiting, KindWaitLeave: WaitLeft, KindWaitOffer: WaitOffered}

// IsWaitlistKind reports whether an event kind is one of the waitlist's.
func IsWaitlistKind(kind string) bool {
	_, ok := waitKindStatus[kind]
	return ok
}

func (e Event) validateWaitlist() error {
	if e.ID == "" || e.SKU == "" || e.Principal == "" || e.Seq <= 0 || e.Quantity <= 0 || e.Quantity > math.MaxInt32 ||
		e.HoldMillis <= 0 || (e.Kind == KindWaitOffer && e.Token == "") {
		return fmt.Errorf("event %q: %w: a waitlist event needs an id, SKU, principal, seq, quantity and hold (and an offer its token)", e.ID, ErrInvalid)
	}
	return nil
}

// WaitlistEntry is one row of waitlist_entries.
type WaitlistEntry struct {
	SKU        string
	Seq        int64
	Principal  string
	Quantity   int
	HoldMillis int64
	Status     string
	Token      string // the offered reservation; "" unless OFFERED
	JoinedAt   time.Time
	EndedAt    *time.Time
}

const waitlistColumns = `sku, seq, principal, quantity, hold_ms, status, coalesce(token, ''), joined_at, ended_at`

func scanWaitlistEntry(row pgx.Row) (WaitlistEntry, error) {
	var w WaitlistEntry
	err := row.Scan(&w.SKU, &w.Seq, &w.Principal, &w.Quantity, &w.HoldMillis, &w.Status, &w.Token, &w.JoinedAt, &w.EndedAt)
	return w, interpret(err)
}

// queueWaitlist queues the statements that write waitlist events in
// ApplyEvents' transaction: a
// join inserts its entry (once: its key is the SKU and seq), a leave or an
// offer moves an entry forward only (WAITING, OFFERED, LEFT; never back). Events are
// applied in their order, joins first, so an offer whose join is in the same
// batch finds its row.
func queueWaitlist(b *pgx.Batch, events []Event) {
	if len(events) == 0 {
		return
	}
	var (
		jSKU, jWho             []string
		jSeq, jHold            []int64
		jQty                   []int32
		jAt                    []time.Time
		uSKU, uStatus, uTok    []string
		uSeq                   []int64
		uAt, uJoined           []time.Time
		uWho                   []string
		uQty                   []int32
		uHold                  []int64
		mID, mSKU, mWho, mKind []string
		mQty                   []int32
		mAt                    []time.Time
	)
	for _, e := range events {
		mID, mSKU, mWho, mKind, mQty, mAt = append(mID, e.ID), append(mSKU, e.SKU), append(mWho, e.Principal),
			append(mKind, e.Kind), append(mQty, int32(e.Quantity)), append(mAt, e.At)
		if e.Kind == KindWaitJoin {
			jSKU, jWho, jSeq, jHold, jQty, jAt = append(jSKU, e.SKU), append(jWho, e.Principal), append(jSeq, e.Seq),
				append(jHold, e.HoldMillis), append(jQty, int32(e.Quantity)), append(jAt, e.CreatedAt)
			continue
		}
		uSKU, uSeq, uStatus, uTok, uAt = append(uSKU, e.SKU), append(uSeq, e.Seq), append(uStatus, waitKindStatus[e.Kind]),
			append(uTok, e.Token), append(uAt, e.At)
		uWho, uQty, uHold = append(uWho, e.Principal), append(uQty, int32(e.Quantity)), append(uHold, e.HoldMillis)
		uJoined = append(uJoined, e.CreatedAt)
	}
	b.Queue(`
		INSERT INTO waitlist_entries (sku, seq, principal, quantity, hold_ms, status, joined_at)
		SELECT s, q, w, n, h, 'WAITING', a
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::timestamptz[]) AS u(s, q, w, n, h, a)
		ON CONFLICT (sku, seq) DO NOTHING`, jSKU, jSeq, jWho, jQty, jHold, jAt)
	// A leave or offer whose join never reached the ledger (lost with Redis
	// before it was read) still records the entry, in its final state.
	b.Queue(`
		INSERT INTO waitlist_entries (sku, seq, principal, quantity, hold_ms, status, token, joined_at, ended_at)
		SELECT s, q, w, n, h, st, nullif(t, ''), j, a
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::text[], $7::text[], $8::timestamptz[], $9::timestamptz[])
			AS u(s, q, w, n, h, st, t, a, j)
		ON CONFLICT (sku, seq) DO UPDATE SET status = excluded.status,
			token = coalesce(excluded.token, waitlist_entries.token),
			ended_at = coalesce(waitlist_entries.ended_at, excluded.ended_at), updated_at = now()
		WHERE waitlist_entries.status = 'WAITING' OR (waitlist_entries.status = 'OFFERED' AND excluded.status = 'LEFT')`,
		uSKU, uSeq, uWho, uQty, uHold, uStatus, uTok, uAt, uJoined)
	b.Queue(`
		INSERT INTO waitlist_movements (event_id, sku, kind, principal, quantity, occurred_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[])
		ON CONFLICT (event_id) DO NOTHING`, mID, mSKU, mKind, mWho, mQty, mAt)
}

// WaitlistOf returns a principal's entries, newest first, at most limit:
// which SKUs it waits on (Redis has the live position and status).
func (wl Waitlists) WaitlistOf(ctx context.Context, principal string, limit int) ([]WaitlistEntry, error) {
	rows, err := wl.l.pool.Query(ctx, `
		SELECT DISTINCT ON (sku) `+waitlistColumns+` FROM waitlist_entries
		WHERE principal = $1 ORDER BY sku, seq DESC`, principal)
	if err != nil {
		return nil, interpret(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WaitlistEntry, error) { return scanWaitlistEntry(r) })
	if err != nil {
		return nil, interpret(err)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// WaitlistEntries returns every entry of a SKU in queue order, for tests and
// audits.
func (wl Waitlists) WaitlistEntries(ctx context.Context, sku string) ([]WaitlistEntry, error) {
	rows, err := wl.l.pool.Query(ctx, `SELECT `+waitlistColumns+` FROM waitlist_entries WHERE sku = $1 ORDER BY seq`, sku)
	if err != nil {
		return nil, interpret(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WaitlistEntry, error) { return scanWaitlistEntry(r) })
	return out, interpret(err)
}

// Waitlist streams, in batches of at most batch and in queue order, the
// entries of the SKU that are not LEFT: what a rebuild restores. fn obeys the
// rules of Reservations.
func (s *Snapshot) Waitlist(ctx context.Context, batch int, fn func([]WaitlistEntry) error) error {
	rows, err := s.tx.Query(ctx, `SELECT `+waitlistColumns+` FROM waitlist_entries
		WHERE sku = $1 AND status <> 'LEFT' ORDER BY seq`, s.Product.SKU)
	if err != nil {
		return interpret(err)
	}
	return eachBatch(rows, batch, scanWaitlistEntry, fn)
}

// MaxWaitlistSeq is the highest seq the ledger has for a SKU (0 when none), so
// a rebuilt queue hands out seqs above every one ever recorded.
func (s *Snapshot) MaxWaitlistSeq(ctx context.Context) (int64, error) {
	var n int64
	err := s.tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM waitlist_entries WHERE sku = $1`, s.Product.SKU).Scan(&n)
	return n, interpret(err)
}
