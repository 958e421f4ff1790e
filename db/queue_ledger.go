package db

import (
	"context"
	"crypto/sha1" //nolint:gosec // a pass is sha1(nonce:number) as admit_queue.lua makes it; the nonce is the secret
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The outbox event kinds of an admission queue. Each names its queue
// (Event.Queue): a join carries the principal and its number (0 in the
// pre-queue); a close the size of the pre-queue frozen at the opening
// (Number); a numbering the pre-queue's principals that got First, First+1,
// ... (Principals); an admission the numbers First..Last it admitted, the
// step's Nonce (every pass is QueuePass(Nonce, number)) and the passes'
// expiry; a spend the principal whose pass bought a hold (Token) or a
// waitlist place.
const (
	KindQueueJoin   = "qjoin"
	KindQueueClose  = "qclose"
	KindQueueNumber = "qnum"
	KindQueueAdmit  = "qadmit"
	KindQueueSpend  = "qspend"
)

// IsQueueKind reports whether an event kind is one of the admission queue's.
func IsQueueKind(kind string) bool {
	switch kind {
	case KindQueueJoin, KindQueueClose, KindQueueNumber, KindQueueAdmit, KindQueueSpend:
		return true
	}
	return false
}

// QueuePass is the pass admit_queue.lua hands the holder of number in the
// step with nonce: the first 32 hex digits of SHA-1("<nonce>:<number>").
func QueuePass(nonce string, number int64) string {
	h := sha1.Sum([]byte(nonce + ":" + strconv.FormatInt(number, 10))) //nolint:gosec // see the import
	return hex.EncodeToString(h[:])[:32]
}

// maxQueueBatch bounds the numbers one numbering or admission event names
// (the scripts write at most 1,000 per step).
const maxQueueBatch = 100_000

func (e Event) validateQueue() error {
	bad := func(why string) error { return fmt.Errorf("event %q: %w: %s", e.ID, ErrInvalid, why) }
	if e.ID == "" || !validQueueID(e.Queue) {
		return bad("a queue event needs an id and a queue (sku:<sku> or drop:<drop>)")
	}
	switch e.Kind {
	case KindQueueJoin, KindQueueSpend:
		if e.Principal == "" || e.Number < 0 {
			return bad("a join or a spend needs its principal")
		}
	case KindQueueClose:
		if e.Number < 0 {
			return bad("a close needs the pre-queue's size")
		}
	case KindQueueNumber:
		if e.First < 1 || len(e.Principals) == 0 || len(e.Principals) > maxQueueBatch {
			return bad("a numbering needs its first number and its principals")
		}
		for _, p := range e.Principals {
			if p == "" {
				return bad("a numbering names no empty principal")
			}
		}
	case KindQueueAdmit:
		if e.First < 1 || e.Last < e.First || e.Last-e.First >= maxQueueBatch || e.Nonce == "" || e.ExpiresAt.IsZero() {
			return bad("an admission needs its numbers, its nonce and its passes' expiry")
		}
	}
	return nil
}

func validQueueID(id string) bool {
	kind, rest, ok := strings.Cut(id, ":")
	return ok && rest != "" && (kind == "sku" || kind == "drop")
}

// splitQueue separates the queue's events from the others, each in order.
func splitQueue(events []Event) (rest, queue []Event) {
	for _, e := range events {
		if IsQueueKind(e.Kind) {
			queue = append(queue, e)
		} else {
			rest = append(rest, e)
		}
	}
	return rest, queue
}

// queueQueueEvents queues the statements that write queue events in
// ApplyEvents' transaction. The queues named are locked first (in id order),
// which a queue's rebuild snapshot waits for (QueueSnapshot): a batch lands
// before the snapshot, which sees it, or after. Rows only move forward, so a
// batch applied twice, or late, changes nothing: a ticket's number, pass and
// spending are each written once, the admitted number only rises, the
// pre-queue's size is the first one recorded. Joins, closes, numberings,
// admissions and spends are written in that order, which is the order they
// happen in for any one ticket.
func queueQueueEvents(b *pgx.Batch, events []Event) {
	if len(events) == 0 {
		return
	}
	var (
		queues               = map[string]bool{}
		qids                 []string
		jQ, jWho             []string
		jNum                 []int64
		jAt                  []time.Time
		cQ                   []string
		cN                   []int64
		nQ, nWho             []string
		nNum                 []int64
		nAt                  []time.Time
		aQ, aPass            []string
		aNum                 []int64
		aExp, aAt            []time.Time
		tQ                   []string
		tLast                []int64
		sQ, sWho, sFor       []string
		sAt                  []time.Time
		mID, mQ, mKind, mWho []string
		mFirst, mLast        []int64
		mAt                  []time.Time
	)
	for _, e := range events {
		if !queues[e.Queue] {
			queues[e.Queue] = true
			qids = append(qids, e.Queue)
		}
		first, last := e.Number, e.Number
		switch e.Kind {
		case KindQueueJoin:
			jQ, jWho, jNum, jAt = append(jQ, e.Queue), append(jWho, e.Principal), append(jNum, e.Number), append(jAt, e.At)
		case KindQueueClose:
			cQ, cN = append(cQ, e.Queue), append(cN, e.Number)
			first = 0
		case KindQueueNumber:
			for i, p := range e.Principals {
				nQ, nWho, nNum, nAt = append(nQ, e.Queue), append(nWho, p), append(nNum, e.First+int64(i)), append(nAt, e.At)
			}
			first, last = e.First, e.First+int64(len(e.Principals))-1
		case KindQueueAdmit:
			for n := e.First; n <= e.Last; n++ {
				aQ, aNum, aPass = append(aQ, e.Queue), append(aNum, n), append(aPass, QueuePass(e.Nonce, n))
				aExp, aAt = append(aExp, e.ExpiresAt), append(aAt, e.At)
			}
			tQ, tLast = append(tQ, e.Queue), append(tLast, e.Last)
			first, last = e.First, e.Last
		case KindQueueSpend:
			sQ, sWho, sFor, sAt = append(sQ, e.Queue), append(sWho, e.Principal), append(sFor, e.Token), append(sAt, e.At)
		}
		mID, mQ, mKind, mWho = append(mID, e.ID), append(mQ, e.Queue), append(mKind, e.Kind), append(mWho, e.Principal)
		mFirst, mLast, mAt = append(mFirst, first), append(mLast, last), append(mAt, e.At)
	}
	b.Queue(`SELECT 1 FROM queues WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`, qids)
	if len(jQ) > 0 {
		b.Queue(`
			INSERT INTO queue_tickets (queue_id, principal, number, pre_queue, joined_at)
			SELECT q, w, nullif(n, 0), n = 0, a FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[]) AS u(q, w, n, a)
			ON CONFLICT (queue_id, principal) DO UPDATE SET number = coalesce(queue_tickets.number, excluded.number)`,
			jQ, jWho, jNum, jAt)
	}
	if len(cQ) > 0 {
		b.Queue(`
			UPDATE queues SET pre_queue_size = coalesce(queues.pre_queue_size, u.n)
			FROM unnest($1::text[], $2::bigint[]) AS u(q, n) WHERE queues.id = u.q`, cQ, cN)
	}
	if len(nQ) > 0 {
		// A numbering whose joins never reached the ledger still records the
		// tickets: they were in the pre-queue.
		b.Queue(`
			INSERT INTO queue_tickets (queue_id, principal, number, pre_queue, joined_at)
			SELECT q, w, n, true, a FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[]) AS u(q, w, n, a)
			ON CONFLICT (queue_id, principal) DO UPDATE SET number = coalesce(queue_tickets.number, excluded.number)`,
			nQ, nWho, nNum, nAt)
	}
	if len(aQ) > 0 {
		b.Queue(`
			UPDATE queue_tickets t SET pass = u.p, pass_expires_at = u.x, admitted_at = u.a
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::timestamptz[], $5::timestamptz[]) AS u(q, n, p, x, a)
			WHERE t.queue_id = u.q AND t.number = u.n AND t.pass IS NULL`, aQ, aNum, aPass, aExp, aAt)
		b.Queue(`
			UPDATE queues SET admitted_through = greatest(queues.admitted_through, u.n)
			FROM (SELECT q, max(n) AS n FROM unnest($1::text[], $2::bigint[]) AS v(q, n) GROUP BY q) AS u
			WHERE queues.id = u.q`, tQ, tLast)
	}
	if len(sQ) > 0 {
		b.Queue(`
			UPDATE queue_tickets t SET spent_at = u.a, spent_for = nullif(u.f, '')
			FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS u(q, w, f, a)
			WHERE t.queue_id = u.q AND t.principal = u.w AND t.pass IS NOT NULL AND t.spent_at IS NULL`, sQ, sWho, sFor, sAt)
	}
	b.Queue(`
		INSERT INTO queue_movements (event_id, queue_id, kind, principal, first_number, last_number, occurred_at)
		SELECT i, q, k, nullif(w, ''), nullif(f, 0), nullif(l, 0), a
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::timestamptz[]) AS u(i, q, k, w, f, l, a)
		ON CONFLICT (event_id) DO NOTHING`, mID, mQ, mKind, mWho, mFirst, mLast, mAt)
}

// QueueTicket is one row of queue_tickets.
type QueueTicket struct {
	Queue     string
	Principal string
	// Number is 0 while the ticket waits in the pre-queue.
	Number   int64
	PreQueue bool
	JoinedAt time.Time
	// Pass is "" until the ticket is admitted.
	Pass          string
	PassExpiresAt *time.Time
	AdmittedAt    *time.Time
	SpentAt       *time.Time
	// SpentFor is what the pass bought: a hold's token, or "" for a
	// waitlist place.
	SpentFor string
}

const queueTicketColumns = `queue_id, principal, coalesce(number, 0), pre_queue, joined_at, coalesce(pass, ''),
	pass_expires_at, admitted_at, spent_at, coalesce(spent_for, '')`

func scanQueueTicket(row pgx.Row) (QueueTicket, error) {
	var t QueueTicket
	err := row.Scan(&t.Queue, &t.Principal, &t.Number, &t.PreQueue, &t.JoinedAt, &t.Pass, &t.PassExpiresAt,
		&t.AdmittedAt, &t.SpentAt, &t.SpentFor)
	return t, interpret(err)
}

// QueueTickets returns every ticket of a queue, numbered ones by number, then
// the pre-queue's by principal: for tests, audits and dropline verify-queue.
func (qs Queues) QueueTickets(ctx context.Context, queue string) ([]QueueTicket, error) {
	rows, err := qs.l.pool.Query(ctx, `SELECT `+queueTicketColumns+` FROM queue_tickets WHERE queue_id = $1
		ORDER BY number NULLS LAST, principal`, queue)
	if err != nil {
		return nil, fmt.Errorf("reading the tickets of %s: %w", queue, interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueTicket, error) { return scanQueueTicket(r) })
	return out, interpret(err)
}

// QueueProgress is what the ledger has of a queue's progress.
type QueueProgress struct {
	// PreQueueSize is the pre-queue's size frozen at the opening; -1 before.
	PreQueueSize    int64
	AdmittedThrough int64
	// LastNumber is the highest number any ticket has.
	LastNumber int64
	// Numbered is how many of the pre-queue's tickets have their number.
	Numbered int64
	// PreQueue is how many tickets joined before the opening.
	PreQueue int64
}

// QueueSnapshot is a queue's rows under its row lock: what a rebuild of the
// queue in Redis restores (Queues.WithQueueSnapshot).
type QueueSnapshot struct {
	tx       pgx.Tx
	Queue    Queue
	Progress QueueProgress
}

// WithQueueSnapshot locks a queue's row and runs fn with its snapshot while
// the lock is held, so no write-behind batch of the queue lands between the
// snapshot and the Redis writes fn makes (queueQueueEvents takes the same
// lock first): the rebuild of a queue lost with Redis sees every event the
// ledger has, or the batch waits for it. ErrNotFound when there is no such
// queue.
func (qs Queues) WithQueueSnapshot(ctx context.Context, id string, fn func(*QueueSnapshot) error) error {
	err := qs.l.inTx(ctx, "queue_snapshot", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		s := &QueueSnapshot{tx: tx}
		var err error
		s.Queue, err = scanQueue(tx.QueryRow(ctx, `SELECT `+queueColumns+` FROM queues WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `
			SELECT coalesce(q.pre_queue_size, -1), q.admitted_through,
				coalesce((SELECT max(number) FROM queue_tickets WHERE queue_id = q.id), 0),
				(SELECT count(*) FROM queue_tickets WHERE queue_id = q.id AND pre_queue AND number IS NOT NULL),
				(SELECT count(*) FROM queue_tickets WHERE queue_id = q.id AND pre_queue)
			FROM queues q WHERE q.id = $1`, id).Scan(&s.Progress.PreQueueSize, &s.Progress.AdmittedThrough,
			&s.Progress.LastNumber, &s.Progress.Numbered, &s.Progress.PreQueue)
		if err != nil {
			return interpret(err)
		}
		return fn(s)
	})
	if err != nil {
		return fmt.Errorf("snapshot of queue %s: %w", id, err)
	}
	return nil
}

// Tickets streams the queue's tickets in batches of at most batch, in no
// particular order; fn obeys the rules of Snapshot.Reservations.
func (s *QueueSnapshot) Tickets(ctx context.Context, batch int, fn func([]QueueTicket) error) error {
	rows, err := s.tx.Query(ctx, `SELECT `+queueTicketColumns+` FROM queue_tickets WHERE queue_id = $1`, s.Queue.ID)
	if err != nil {
		return interpret(err)
	}
	return eachBatch(rows, batch, scanQueueTicket, fn)
}
