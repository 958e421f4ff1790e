package db

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// ErrFenced means a newer lease holder has written since this writer's lease
// was granted: the writer was paused or partitioned and must stop.
var ErrFenced = errors.New("fenced off by a newer lease holder")

// ErrUnknownKind means an event's kind is not one this version applies: a
// newer version wrote it (a rolling upgrade) or the entry is corrupt.
var ErrUnknownKind = errors.New("unknown event kind")

// Event is one change from the write-behind outbox. Every event carries the
// whole reservation, so it can be applied even if an earlier one was lost.
type Event struct {
	// ID is derived from what happened ("reserve:<token>", "expire:<token>",
	// "extend:<token>:<n>"), which makes applying an event twice a no-op.
	ID              string
	Kind            string // reserve, extend, commit, cancel or expire
	Token           string
	SKU             string
	Principal       string
	Quantity        int
	ExpiresAt       time.Time
	CreatedAt       time.Time
	At              time.Time
	IdempotencyHash string
	RequestHash     string
	// Gen is the generation of the SKU's life in Redis the hold lived in. The
	// ledger does not store it; the write-behind worker compares it with the
	// SKU's generation after applying the event.
	Gen string
	// Extensions is how many times the hold had been extended when the event
	// was written; ExpiresAt is its expiry then. The ledger keeps the expiry
	// of the event with the most, whatever order events arrive in.
	Extensions int
	// Seq and HoldMillis are a waitlist event's entry (its place in the SKU's
	// queue) and the hold it asked for; zero for every other kind.
	Seq        int64
	HoldMillis int64
	// Queue, Number, First, Last, Principals and Nonce are an admission
	// queue's event (IsQueueKind; see its kinds); zero for every other kind.
	Queue       string
	Number      int64
	First, Last int64
	Principals  []string
	Nonce       string
}

// Fence identifies a lease-guarded writer: Token must be at least the highest
// token that has written under Name.
type Fence struct {
	Name  string
	Token int64
}

var kindStatus = map[string]string{
	"reserve": StatusHeld, "extend": StatusHeld, "commit": StatusCommitted, "cancel": StatusCancelled, "expire": StatusExpired,
}

// Validate reports whether ApplyEvents can apply e: ErrUnknownKind for a
// kind this version does not know, ErrInvalid for a missing id, token or SKU
// or a quantity out of range. The write-behind checks every event with it
// before a batch, so one bad event is set aside instead of failing the batch.
func (e Event) Validate() error {
	if IsWaitlistKind(e.Kind) {
		return e.validateWaitlist()
	}
	if IsQueueKind(e.Kind) {
		return e.validateQueue()
	}
	if _, ok := kindStatus[e.Kind]; !ok {
		return fmt.Errorf("event %q: %w %q", e.ID, ErrUnknownKind, e.Kind)
	}
	if e.ID == "" || e.Token == "" || e.SKU == "" || e.Quantity <= 0 || e.Quantity > math.MaxInt32 {
		return fmt.Errorf("event %q: %w: id, token, SKU and a quantity of 1 to 2^31-1 are required", e.ID, ErrInvalid)
	}
	if e.Extensions < 0 || e.Extensions > math.MaxInt32 {
		return fmt.Errorf("event %q: %w: extensions must be between 0 and 2^31-1", e.ID, ErrInvalid)
	}
	return nil
}

// ApplyEvents writes a batch of outbox events in one transaction, sent in one
// round trip: one movement
// per event (skipped when its ID is known) and each reservation's latest state.
// A reservation only moves forward out of HELD, so late, repeated or reordered
// batches change nothing that is already final. A reservation is released at
// most once in the ledger: a cancel or expiry of one the ledger has as sold,
// or as released the other way, records no movement (two lives of a SKU in
// Redis can each end the same hold after a rebuild). With a non-nil fence the
// batch is refused with ErrFenced when a newer lease holder has written.
//
// A hold whose only event in the batch is its reserve is written with plain
// inserts, which cost Postgres less than an upsert: when its row or
// movement exists after all (the batch was applied before, or a sale or a
// synchronous cancel wrote the row first), the transaction fails whole and
// the batch is sent once more with every row an upsert.
//
// The batch takes a key-share lock on its products, which waits for a
// rebuild's snapshot (WithSnapshot holds the product row lock until Redis is
// written): a batch lands either before a snapshot, which then sees it, or
// after the rebuilt SKU is in Redis with its new generation, which is how the
// write-behind worker knows to tell Redis what the batch changed.
//
// ErrRefused means the batch cannot be applied as it is (an event fails
// Validate, or Postgres refused the values): the same batch fails again, and
// the caller should split it to find the event at fault. Any other error is
// an outage or a timeout, and the batch may be retried whole.
func (l *Ledger) ApplyEvents(ctx context.Context, fence *Fence, events []Event) error {
	return l.applyEvents(ctx, fence, events, nil)
}

// ApplyEventsUnflushed is ApplyEvents for the write-behind, whose events
// stay in the outbox until it acknowledges them: a batch of fresh holds
// written in one round trip (applyRowsCopy) is committed without waiting
// for its WAL to reach the disk (synchronous_commit off), and the returned
// Commit says where, for the caller to acknowledge the events only once
// Flushed shows the commit durable. Any other batch is committed as
// ApplyEvents commits it, and the Commit is the zero value: durable already.
func (l *Ledger) ApplyEventsUnflushed(ctx context.Context, fence *Fence, events []Event) (Commit, error) {
	var c Commit
	err := l.applyEvents(ctx, fence, events, &c)
	if err != nil {
		return Commit{}, err
	}
	return c, nil
}

func (l *Ledger) applyEvents(ctx context.Context, fence *Fence, events []Event, commit *Commit) error {
	if len(events) == 0 {
		return nil
	}
	all := events
	events, queued := splitQueue(events)
	events, waits := splitWaitlist(events)
	for _, e := range queued {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("applying events: %w: %w", ErrRefused, err)
		}
	}
	for _, e := range waits {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("applying events: %w: %w", ErrRefused, err)
		}
	}
	// Fold events per token, in order, into each reservation's latest state.
	latest := map[string]*folded{}
	var order []string
	skuSet := map[string]bool{}
	var skuList, released []string
	moves := make([]int, 0, len(events)) // the events that are a movement
	for i, e := range events {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("applying events: %w: %w", ErrRefused, err)
		}
		status := kindStatus[e.Kind]
		if !skuSet[e.SKU] {
			skuSet[e.SKU] = true
			skuList = append(skuList, e.SKU)
		}
		if status == StatusCancelled || status == StatusExpired {
			released = append(released, e.Token)
		}
		f := latest[e.Token]
		// One ending per token in a batch: a second release (or a release
		// after the sale) of the same hold is no movement.
		if f == nil || f.Status == StatusHeld || status == StatusHeld {
			moves = append(moves, i)
		}
		if f == nil {
			f = &folded{Reservation: Reservation{Token: e.Token, SKU: e.SKU, Principal: e.Principal, Quantity: e.Quantity,
				Status: StatusHeld, IdempotencyHash: e.IdempotencyHash, RequestHash: e.RequestHash,
				ExpiresAt: e.ExpiresAt, CreatedAt: e.CreatedAt, Extensions: e.Extensions}, fresh: e.Kind == "reserve"}
			latest[e.Token] = f
			order = append(order, e.Token)
		} else {
			f.fresh = false
		}
		s := &f.Reservation
		if e.Extensions > s.Extensions {
			s.ExpiresAt, s.Extensions = e.ExpiresAt, e.Extensions
		}
		if s.Status == StatusHeld && status != StatusHeld {
			s.Status = status
			at := e.At
			if status == StatusCommitted {
				s.CommittedAt = &at
			} else {
				s.EndedAt = &at
			}
		}
	}
	sort.Strings(skuList) // one lock order for every writer
	fb := &foldedBatch{skus: skuList, released: released, events: events, moves: moves, latest: latest, order: order, waits: waits,
		queued: queued}
	err := l.applyRows(ctx, fence, fb, true, commit)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && fb.freshCount() > 0 {
		// A row the batch took for new exists (the batch was applied
		// before, or another writer got there first): the batch again,
		// every row written as an upsert.
		err = l.applyRows(ctx, fence, fb, false, commit)
	}
	err = interpret(err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrFenced) || errors.Is(err, ErrRefused):
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrExists) || errors.Is(err, ErrWouldOversell):
		err = fmt.Errorf("%w: %w", ErrRefused, err) // a constraint refused the values
	}
	return fmt.Errorf("applying %d events: %w", len(all), err)
}

// foldedBatch is a batch's events folded per reservation: the products
// (sorted), the tokens released, which events are a movement, each
// reservation's latest state, in the order the batch first names them, and
// the waitlist's events.
type foldedBatch struct {
	skus, released []string
	events         []Event
	moves          []int
	latest         map[string]*folded
	order          []string
	waits          []Event
	queued         []Event
}

// freshCount is how many of the batch's reservations are fresh.
func (fb *foldedBatch) freshCount() int {
	n := 0
	for _, f := range fb.latest {
		if f.fresh {
			n++
		}
	}
	return n
}

// folded is one reservation's latest state in a batch. fresh says that the
// batch's only event of it is its reserve: the reservation is most likely
// new to the ledger, and its row and movement are written as plain inserts.
type folded struct {
	Reservation
	fresh bool
}

// moveRows and reservationRows are the columns of the rows one unnest
// statement writes.
type moveRows struct {
	ids, skus, kinds, tokens, principals []string
	qtys                                 []int32
	ats                                  []time.Time
}

func makeMoveRows(n int) moveRows {
	return moveRows{ids: make([]string, 0, n), skus: make([]string, 0, n), kinds: make([]string, 0, n),
		tokens: make([]string, 0, n), principals: make([]string, 0, n), qtys: make([]int32, 0, n), ats: make([]time.Time, 0, n)}
}

// args are the statement's arguments: the columns in movementRows' order.
func (m *moveRows) args() []any {
	return []any{m.ids, m.skus, m.kinds, m.tokens, m.principals, m.qtys, m.ats}
}

func (m *moveRows) add(e Event) {
	m.ids, m.skus, m.kinds, m.tokens, m.principals = append(m.ids, e.ID), append(m.skus, e.SKU), append(m.kinds, e.Kind),
		append(m.tokens, e.Token), append(m.principals, e.Principal)
	m.qtys, m.ats = append(m.qtys, int32(e.Quantity)), append(m.ats, e.At)
}

type reservationRows struct {
	toks, skus, who, statuses, idem, req []string
	qtys, exts                           []int32
	exps, ctds                           []time.Time
	cmts, ends                           []*time.Time
}

func makeReservationRows(n int) reservationRows {
	return reservationRows{toks: make([]string, 0, n), skus: make([]string, 0, n), who: make([]string, 0, n),
		statuses: make([]string, 0, n), idem: make([]string, 0, n), req: make([]string, 0, n),
		qtys: make([]int32, 0, n), exts: make([]int32, 0, n), exps: make([]time.Time, 0, n), ctds: make([]time.Time, 0, n),
		cmts: make([]*time.Time, 0, n), ends: make([]*time.Time, 0, n)}
}

// args are the statement's arguments: the columns in insertReservations'
// order.
func (r *reservationRows) args() []any {
	return []any{r.toks, r.skus, r.who, r.qtys, r.statuses, r.idem, r.req, r.exps, r.ctds, r.cmts, r.ends, r.exts}
}

func (r *reservationRows) add(s *Reservation) {
	r.toks, r.skus, r.who, r.statuses, r.idem, r.req = append(r.toks, s.Token), append(r.skus, s.SKU), append(r.who, s.Principal),
		append(r.statuses, s.Status), append(r.idem, s.IdempotencyHash), append(r.req, s.RequestHash)
	r.qtys, r.exts = append(r.qtys, int32(s.Quantity)), append(r.exts, int32(s.Extensions))
	r.exps, r.ctds, r.cmts, r.ends = append(r.exps, s.ExpiresAt), append(r.ctds, s.CreatedAt), append(r.cmts, s.CommittedAt), append(r.ends, s.EndedAt)
}

// The rows of a batch's statements are its arrays unnested in the select
// list, which streams them, rather than in FROM, which copies them into a
// tuple store first.
const (
	insertMovements = `INSERT INTO stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at) `
	movementRows    = `SELECT unnest($1::text[]) AS event_id, unnest($2::text[]) AS sku, unnest($3::text[]) AS kind,
		unnest($4::text[]) AS token, unnest($5::text[]) AS principal, unnest($6::int[]) AS quantity,
		unnest($7::timestamptz[]) AS occurred_at`
	insertReservations = `
		INSERT INTO reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
			expires_at, created_at, committed_at, ended_at, extensions)
		SELECT unnest($1::text[]), unnest($2::text[]), unnest($3::text[]), unnest($4::int[]), unnest($5::text[]),
			nullif(unnest($6::text[]), ''), nullif(unnest($7::text[]), ''), unnest($8::timestamptz[]), unnest($9::timestamptz[]),
			unnest($10::timestamptz[]), unnest($11::timestamptz[]), unnest($12::int[])`
)

// applyRows writes the folded batch in one transaction, sent in one round
// trip. With plain, the rows of fresh reservations are plain inserts,
// which skip the conflict checks of an upsert (a lookup in the unique index
// before each insert, besides the insert's own): if one such row exists
// after all, the insert fails with a unique violation (23505) and the whole
// transaction is rolled back, for the caller to send it again without.
//
// With a non-nil commit a copied batch is committed unflushed and commit
// says where (ApplyEventsUnflushed); any other is committed durably and
// commit is left zero.
func (l *Ledger) applyRows(ctx context.Context, fence *Fence, fb *foldedBatch, plain bool, commit *Commit) error {
	if commit != nil {
		*commit = Commit{}
	}
	fresh := 0
	if plain {
		fresh = fb.freshCount()
	}
	// A fresh reservation has one event, its movement.
	freshMoves, otherMoves := makeMoveRows(fresh), makeMoveRows(len(fb.moves)-fresh)
	for _, i := range fb.moves {
		e := fb.events[i]
		if plain && fb.latest[e.Token].fresh {
			freshMoves.add(e)
		} else {
			otherMoves.add(e)
		}
	}
	freshRes, otherRes := makeReservationRows(fresh), makeReservationRows(len(fb.order)-fresh)
	for _, tok := range fb.order {
		f := fb.latest[tok]
		if plain && f.fresh {
			freshRes.add(&f.Reservation)
		} else {
			otherRes.add(&f.Reservation)
		}
	}

	if l.copyMinRows > 0 && len(freshRes.toks) >= l.copyMinRows {
		return l.applyRowsCopy(ctx, fence, fb, &freshMoves, &otherMoves, &freshRes, &otherRes, commit)
	}
	// One round trip: the statements are sent as one pipeline ending in a
	// single sync, which Postgres runs as one implicit transaction, committed
	// at the sync; the first statement that fails (a fenced batch:
	// worker_fence raises) rolls the whole batch back.
	b := &pgx.Batch{}
	queueLocks(b, fence, fb)
	if len(freshMoves.ids) > 0 {
		b.Queue(insertMovements+movementRows, freshMoves.args()...)
	}
	queueUpserts(b, fb, &otherMoves, &freshRes, &otherRes)
	var span trace.Span
	if l.tracer != nil {
		ctx, span = l.startTx(ctx, "apply_events")
		span.SetAttributes(attribute.Int("dropline.events", len(fb.events)))
	}
	res := l.pool.SendBatch(ctx, b)
	var err error
	for range b.Len() {
		if _, err = res.Exec(); err != nil {
			break
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if span != nil {
		endTx(span, err)
	}
	return err
}

// queueLocks queues the fence's check, the products' key-share locks and
// the locks of the reservations the batch releases: what comes before any
// row is written.
func queueLocks(b *pgx.Batch, fence *Fence, fb *foldedBatch) {
	if fence != nil {
		b.Queue(`SELECT worker_fence($1, $2)`, fence.Name, fence.Token)
	}
	// The products' key-share locks, and the check that each exists (the
	// rows written below have no foreign key of their own: migration 0010).
	b.Queue(`SELECT lock_products($1)`, fb.skus)
	// Lock the reservations a release ends first, so that two writers of one
	// token (the write-behind, a synchronous cancel, a sale) see each other's
	// ending before the movement is decided.
	if len(fb.released) > 0 {
		b.Queue(`SELECT 1 FROM reservations WHERE token = ANY($1) ORDER BY token FOR UPDATE`, fb.released)
	}
}

// queueUpserts queues the rows that may exist already (every row but the
// fresh ones) and the waitlist's. freshRes, when not nil, is queued as
// plain inserts between the movements and the reservations' upserts.
func queueUpserts(b *pgx.Batch, fb *foldedBatch, otherMoves *moveRows, freshRes, otherRes *reservationRows) {
	if len(otherMoves.ids) > 0 {
		b.Queue(insertMovements+`SELECT * FROM (`+movementRows+`) AS u
			WHERE u.kind NOT IN ('cancel', 'expire') OR NOT EXISTS (
				SELECT 1 FROM reservations r WHERE r.token = u.token
				AND r.status NOT IN ('HELD', CASE u.kind WHEN 'cancel' THEN 'CANCELLED' ELSE 'EXPIRED' END))
			ON CONFLICT (event_id) DO NOTHING`, otherMoves.args()...)
	}
	if freshRes != nil && len(freshRes.toks) > 0 {
		b.Queue(insertReservations, freshRes.args()...)
	}
	if len(otherRes.toks) > 0 {
		b.Queue(insertReservations+`
			ON CONFLICT (token) DO UPDATE SET
				-- the expiry of the most extended state seen; a late event never brings an earlier one back
				expires_at = CASE WHEN excluded.extensions > reservations.extensions THEN excluded.expires_at ELSE reservations.expires_at END,
				extensions = greatest(reservations.extensions, excluded.extensions),
				status = CASE WHEN reservations.status = 'HELD' THEN excluded.status ELSE reservations.status END,
				committed_at = CASE WHEN reservations.status = 'HELD' THEN excluded.committed_at ELSE reservations.committed_at END,
				ended_at = CASE WHEN reservations.status = 'HELD' THEN excluded.ended_at ELSE reservations.ended_at END,
				-- a commit writes its row before the reserve event arrives with these
				idempotency_hash = coalesce(reservations.idempotency_hash, excluded.idempotency_hash),
				request_hash = coalesce(reservations.request_hash, excluded.request_hash),
				updated_at = now()`, otherRes.args()...)
	}
	queueWaitlist(b, fb.waits)
	queueQueueEvents(b, fb.queued)
}

// splitWaitlist separates the waitlist's events from the reservations' ones,
// each in its order.
func splitWaitlist(events []Event) (rest, waits []Event) {
	for _, e := range events {
		if IsWaitlistKind(e.Kind) {
			waits = append(waits, e)
		} else {
			rest = append(rest, e)
		}
	}
	return rest, waits
}
