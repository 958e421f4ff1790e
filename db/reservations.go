package db

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"
)

// Reservation statuses as the ledger stores them.
const (
	StatusHeld      = "HELD"
	StatusCommitted = "COMMITTED"
	StatusCancelled = "CANCELLED"
	StatusExpired   = "EXPIRED"
)

// Reservation is the ledger's copy of a hold.
type Reservation struct {
	Token           string
	SKU             string
	Principal       string
	Quantity        int
	Status          string
	IdempotencyHash string
	RequestHash     string
	ExpiresAt       time.Time
	CreatedAt       time.Time
	CommittedAt     *time.Time
	EndedAt         *time.Time
	// Extensions is how many times the hold's expiry was extended; ExpiresAt
	// is the latest one.
	Extensions int
	// DroppedAt is set on a HELD row when a rebuild of its SKU recorded the
	// hold as expired in Redis (Snapshot.Seal): its expiry is on its
	// way through the outbox, and the ledger refuses its sale as EXPIRED.
	DroppedAt *time.Time
}

const reservationColumns = `token, sku, principal, quantity, status, coalesce(idempotency_hash, ''),
	coalesce(request_hash, ''), expires_at, created_at, committed_at, ended_at, extensions, dropped_at`

func scanReservation(row pgx.Row) (Reservation, error) {
	var r Reservation
	err := row.Scan(&r.Token, &r.SKU, &r.Principal, &r.Quantity, &r.Status, &r.IdempotencyHash,
		&r.RequestHash, &r.ExpiresAt, &r.CreatedAt, &r.CommittedAt, &r.EndedAt, &r.Extensions, &r.DroppedAt)
	return r, interpret(err)
}

// Reservation returns the ledger's copy of one reservation.
func (rs Reservations) Reservation(ctx context.Context, token string) (Reservation, error) {
	r, err := scanReservation(rs.l.pool.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations WHERE token = $1`, token))
	if err != nil {
		return Reservation{}, fmt.Errorf("reading reservation: %w", err)
	}
	return r, nil
}

// ReservationsByPrincipal lists a principal's reservations, newest first,
// after the given (createdAt, token) keyset cursor when after is non-nil.
// status "" means every status.
func (rs Reservations) ReservationsByPrincipal(ctx context.Context, principal, status string, after *ReservationCursor, limit int) ([]Reservation, error) {
	var afterAt *time.Time
	afterToken := ""
	if after != nil {
		afterAt, afterToken = &after.CreatedAt, after.Token
	}
	rows, err := rs.l.pool.Query(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE principal = $1 AND ($2 = '' OR status = $2)
		  AND ($3::timestamptz IS NULL OR (created_at, token) < ($3, $4))
		ORDER BY created_at DESC, token DESC LIMIT $5`, principal, status, afterAt, afterToken, limit)
	if err != nil {
		return nil, fmt.Errorf("listing reservations: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reservation, error) { return scanReservation(r) })
	if err != nil {
		return nil, fmt.Errorf("listing reservations: %w", err)
	}
	return out, nil
}

// ReservationCursor is the keyset position of a reservation in a listing.
type ReservationCursor struct {
	CreatedAt time.Time
	Token     string
}

// Sale is one committed reservation.
type Sale struct {
	Token       string
	SKU         string
	Principal   string
	Quantity    int
	CommittedAt time.Time
}

// Sale returns the sale of a token.
func (ss Sales) Sale(ctx context.Context, token string) (Sale, error) {
	var s Sale
	err := ss.l.pool.QueryRow(ctx, `SELECT token, sku, principal, quantity, committed_at FROM sales WHERE token = $1`, token).
		Scan(&s.Token, &s.SKU, &s.Principal, &s.Quantity, &s.CommittedAt)
	if err != nil {
		return Sale{}, fmt.Errorf("reading sale: %w", interpret(err))
	}
	return s, nil
}

// RecordSale writes the sale of a reservation durably: the sale row, the
// reservation row, the movement and the product's sold count, in one
// transaction. It is idempotent on the token: a second call returns the first
// sale and changes nothing. It returns ErrWouldOversell when sold would exceed
// the total, and an *EndedError when the ledger has the reservation as
// CANCELLED or EXPIRED: a finished reservation is never turned into a sale
// (Redis can think it HELD after a rebuild that predates its ending).
//
// The sales that arrive together are written together, in one transaction
// (saleBatcher, record_sales of migration 0019): the product's row, which
// every sale of the SKU waits for, is locked once for all of them, for its
// update and the commit only, and their WAL flushed once. Each sale is
// answered for itself: one refused does not refuse the others.
func (ss Sales) RecordSale(ctx context.Context, r Reservation) (Sale, error) {
	var (
		sale Sale
		err  error
	)
	if ss.l.sales != nil {
		sale, err = ss.l.recordSaleInBatch(ctx, r)
	} else {
		var span trace.Span
		if ss.l.tracer != nil {
			ctx, span = ss.l.startTx(ctx, "record_sale")
		}
		sale, err = recordSale(ctx, ss.l.salePool, r, "")
		if span != nil {
			endTx(span, err)
		}
	}
	if err != nil {
		return Sale{}, fmt.Errorf("recording sale %s: %w", r.Token, err)
	}
	return sale, nil
}

// RecordCartSale sells every line of a cart in one transaction, with the
// cart's row: every line is sold, or none is. Each line is sold as
// RecordSale sells one reservation, and the call is idempotent in the same
// way (a second call finds the sales and returns them). Any line that would
// oversell or that the ledger has as finished rolls the whole cart back, with
// RecordSale's errors. Lines are written in SKU order, so two carts sharing
// products lock their rows in one order.
func (ss Sales) RecordCartSale(ctx context.Context, cart, principal string, lines []Reservation) ([]Sale, error) {
	sorted := slices.Clone(lines)
	slices.SortFunc(sorted, func(a, b Reservation) int { return strings.Compare(a.SKU+"\x00"+a.Token, b.SKU+"\x00"+b.Token) })
	var sales []Sale
	err := ss.l.inTx(ctx, "record_cart_sale", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		sales = sales[:0]
		if _, err := tx.Exec(ctx, `INSERT INTO carts (token, principal, lines) VALUES ($1, $2, $3)
			ON CONFLICT (token) DO NOTHING`, cart, principal, len(lines)); err != nil {
			return interpret(err)
		}
		for _, r := range sorted {
			s, err := recordSale(ctx, tx, r, cart)
			if err != nil {
				return err
			}
			sales = append(sales, s)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recording cart sale %s: %w", cart, err)
	}
	return sales, nil
}

// CartSales returns the sales of a cart, and how many lines its row says it
// has; ErrNotFound when the ledger has no such cart.
func (ss Sales) CartSales(ctx context.Context, cart string) (lines int, sales []Sale, err error) {
	if err := ss.l.pool.QueryRow(ctx, `SELECT lines FROM carts WHERE token = $1`, cart).Scan(&lines); err != nil {
		return 0, nil, fmt.Errorf("reading cart %s: %w", cart, interpret(err))
	}
	rows, err := ss.l.pool.Query(ctx, `SELECT token, sku, principal, quantity, committed_at FROM sales WHERE cart = $1 ORDER BY sku`, cart)
	if err != nil {
		return 0, nil, fmt.Errorf("reading cart %s: %w", cart, interpret(err))
	}
	sales, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Sale, error) {
		var s Sale
		return s, r.Scan(&s.Token, &s.SKU, &s.Principal, &s.Quantity, &s.CommittedAt)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("reading cart %s: %w", cart, interpret(err))
	}
	return lines, sales, nil
}

// recordSale sells one reservation with record_sale, in q's transaction (a
// transaction of its own when q is the pool); cart is the cart the sale
// belongs to, "" for none.
func recordSale(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, r Reservation, cart string) (Sale, error) {
	sale := Sale{Token: r.Token}
	err := q.QueryRow(ctx, `SELECT sold_sku, sold_principal, sold_quantity, sold_at
		FROM record_sale($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		r.Token, r.SKU, r.Principal, r.Quantity, cart, r.IdempotencyHash, r.RequestHash, r.ExpiresAt, r.CreatedAt).
		Scan(&sale.SKU, &sale.Principal, &sale.Quantity, &sale.CommittedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case saleEndedCode:
			return Sale{}, &EndedError{Status: pgErr.Detail}
		case saleOversellCode:
			return Sale{}, ErrWouldOversell
		}
	}
	if err != nil {
		return Sale{}, interpret(err)
	}
	return sale, nil
}

// The SQLSTATEs of record_sale's refusals (migration 0018).
const (
	saleEndedCode    = "DL002"
	saleOversellCode = "DL003"
)

// Snapshot is what Postgres knows of one SKU, read under the product's row
// lock: enough to rebuild the SKU in Redis. Its rows are streamed in batches
// rather than loaded whole, so a SKU with hundreds of thousands of
// reservations costs a batch of memory, not all of them.
type Snapshot struct {
	Product Product

	l                         *Ledger
	tx                        pgx.Tx
	retention, idempotencyTTL time.Duration
}

// Bought is the number of units one principal has bought of a SKU.
type Bought struct {
	Principal string
	Units     int
}

// Reservations streams the reservations a rebuild restores, in batches of at
// most batch, as one consistent read: first those the ledger has as HELD,
// oldest first (some may be past their expiry); then the sales of the
// retention window, with their reservation data, as COMMITTED; then the
// cancelled and expired reservations made with an idempotency key within the
// idempotency window, so the key still replays them. fn must not keep the
// slice, and must not use the ledger: the snapshot's connection is busy
// streaming while it runs.
func (s *Snapshot) Reservations(ctx context.Context, batch int, fn func([]Reservation) error) error {
	// One statement, so one view of the table: a reservation the write-behind
	// moves from HELD to CANCELLED meanwhile is read once, in one state.
	rows, err := s.tx.Query(ctx, `
		SELECT * FROM (
			SELECT `+reservationColumns+` FROM reservations WHERE sku = $1 AND status = 'HELD'
			UNION ALL
			SELECT s.token, s.sku, s.principal, s.quantity, 'COMMITTED', coalesce(r.idempotency_hash, ''),
				coalesce(r.request_hash, ''), coalesce(r.expires_at, s.committed_at), coalesce(r.created_at, s.committed_at),
				s.committed_at, NULL::timestamptz, coalesce(r.extensions, 0), NULL::timestamptz
			FROM sales s LEFT JOIN reservations r USING (token)
			WHERE s.sku = $1 AND s.committed_at > now() - make_interval(secs => $2)
			UNION ALL
			SELECT `+reservationColumns+` FROM reservations
			WHERE sku = $1 AND status IN ('CANCELLED', 'EXPIRED') AND idempotency_hash IS NOT NULL
			  AND created_at > now() - make_interval(secs => $3)
		) snapshot (token, sku, principal, quantity, status, idempotency_hash, request_hash, expires_at, created_at, committed_at, ended_at, extensions, dropped_at)
		ORDER BY status <> 'HELD', created_at, token`,
		s.Product.SKU, s.retention.Seconds(), s.idempotencyTTL.Seconds())
	if err != nil {
		return interpret(err)
	}
	return eachBatch(rows, batch, scanReservation, fn)
}

// Bought streams, in batches of at most batch, the units each principal has
// bought of the SKU (every sale, not only the retention window's). Sales of
// the SKU cannot change while the snapshot holds the product's lock. fn obeys
// the rules of Reservations.
func (s *Snapshot) Bought(ctx context.Context, batch int, fn func([]Bought) error) error {
	rows, err := s.tx.Query(ctx, `SELECT principal, sum(quantity)::int FROM sales WHERE sku = $1 GROUP BY principal`, s.Product.SKU)
	if err != nil {
		return interpret(err)
	}
	return eachBatch(rows, batch, func(row pgx.Row) (Bought, error) {
		var b Bought
		return b, interpret(row.Scan(&b.Principal, &b.Units))
	}, fn)
}

// ErrRowsBusy means Seal found a row another transaction holds: a sale of
// that hold is being written, and waits for the product's row lock the
// snapshot holds. The snapshot must be given up (its transaction rolled
// back, nothing published) and taken again: the sale then ends first.
var ErrRowsBusy = errors.New("a reservation row is being written")

// markDroppedLockTimeout bounds Seal's wait for a row lock. A sale writing
// the row waits for the snapshot's product lock, so it never lets go; the
// write-behind's transactions take the product's lock first, so they do not
// hold a row of the SKU while the snapshot runs.
const markDroppedLockTimeout = "200ms"

// sealConnWait bounds Seal's wait for a connection of its own while the
// snapshot holds one, from the pool and then dialled: snapshots waiting for
// each other's connections must not hold the pool for good. It leaves room
// for the pool to open a connection (a few milliseconds; hundreds on a
// loaded machine).
const sealConnWait = 2 * time.Second

// snapshotSlots is how many snapshots a pool of maxConns connections has
// in flight at once: half of them, at least one. A snapshot holds one
// connection while its seal takes a second, so snapshots taking every
// connection would each wait sealConnWait for the pool and then dial one
// outside it, while every other query of the process waited for the pool
// behind them; after Redis lost its data, the rebuilder's SKUs did so in
// waves. With half the pool for snapshots, their seals find the other
// half, unless the rest of the process holds it then.
func snapshotSlots(maxConns int32) int { return max(1, int(maxConns)/2) }

// flushWAL is a statement whose transaction, committed on its own, waits for
// PostgreSQL's WAL to be on disk up to its commit, and so past every commit
// before it (the WAL is flushed in order). It writes a WAL record, a
// transactional logical message no one reads: a transaction whose only
// record is its commit's is committed without waiting for the flush,
// whatever synchronous_commit says.
const flushWAL = `SELECT pg_logical_emit_message(true, 'dropline.flush', '')`

// FlushWAL makes durable every commit a read made before it could see: a
// batch the write-behind committed without waiting for its WAL
// (ApplyEventsUnflushed) is visible at once, and a PostgreSQL crash before
// the WAL writer flushes it loses it. A caller that tells Redis or a client
// what it read of such rows calls it first. It costs one round trip and
// one WAL flush, which PostgreSQL shares with the commits flushing at the
// same moment.
func (l *Ledger) FlushWAL(ctx context.Context) error {
	_, err := l.pool.Exec(ctx, flushWAL)
	return interpret(err)
}

// Seal is the snapshot's last step before the rebuild publishes its SKU, so
// that nothing the SKU goes live with can be undone by PostgreSQL behind it.
//
// It makes every commit the snapshot read durable (flushWAL). A batch the
// write-behind committed without waiting for its WAL is visible to the
// snapshot at once; the snapshot's own commit would flush it (its row lock
// is WAL), but the SKU is published before that commit, and a crash in
// between would leave Redis with holds the ledger lost. Nothing would apply
// them again when Redis had lost its outbox too.
//
// It records, on the given reservations the ledger still has as HELD, that
// this rebuild records them as expired in Redis (dropped_at): the ledger
// then refuses their sale as EXPIRED (record_sale, migration 0024). Their
// status stays HELD: the expiry reaches the ledger through the outbox, and a
// cancel acknowledged earlier that reaches it first is still recorded as a
// cancel. Called after the snapshot's rows are read and before the SKU is
// published, no sale is written between the two: a sale whose write finds
// the row marked is refused, and one that holds the row (it waits for the
// product's lock) makes Seal return ErrRowsBusy.
//
// Both are committed in a transaction of their own, on a second connection,
// while the snapshot keeps the product's lock: the marks outlive a snapshot
// whose transaction PostgreSQL fails after the SKU went live (its connection
// lost), which would otherwise take them with it and let such a sale
// through. Marks of a rebuild that then publishes nothing stay: the next
// rebuild drops those holds again. The snapshot's own connection is then
// checked, so a snapshot that lost its lock before the seal is not
// published. When the pool has no connection to spare within sealConnWait
// (other snapshots hold it), one is dialled outside it, as the pool would
// open it, and closed after the seal; a dial that fails fails the rebuild,
// which has published nothing.
//
// Without marks it costs one round trip (a simple query) and a WAL flush;
// with marks, five (BEGIN, two for the marks, the record, COMMIT) and the
// flush.
func (s *Snapshot) Seal(ctx context.Context, dropped []string) error {
	conn, done, err := s.l.sealConn(ctx)
	if err != nil {
		return fmt.Errorf("a connection for the seal: %w", interpret(err))
	}
	err = s.l.sealOn(ctx, conn, dropped)
	done()
	if err != nil {
		return err
	}
	// The snapshot must still hold the product's lock: if its connection was
	// lost meanwhile, a sale may have been written since the snapshot, and
	// the SKU must not be published from it.
	_, err = s.tx.Exec(ctx, `SELECT 1`)
	return interpret(err)
}

// sealConn returns a connection for Seal, and what to call when done with
// it: one of the pool's if it has one to spare within sealConnWait, else one
// dialled outside the pool, within sealConnWait too, and closed after. It is
// dialled as the pool opens its own: the same settings (its run-time
// parameters among them: search_path, statement_timeout) and connect hooks.
func (l *Ledger) sealConn(ctx context.Context) (*pgx.Conn, func(), error) {
	wait, stopWait := context.WithTimeout(ctx, sealConnWait)
	defer stopWait()
	if c, err := l.pool.Acquire(wait); err == nil {
		return c.Conn(), c.Release, nil
	} else if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	dial, stopDial := context.WithTimeout(ctx, sealConnWait)
	defer stopDial()
	cfg := l.pool.Config()
	cc := cfg.ConnConfig.Copy()
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(dial, cc); err != nil {
			return nil, nil, err
		}
	}
	conn, err := pgx.ConnectConfig(dial, cc)
	if err != nil {
		return nil, nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(dial, conn); err != nil {
			conn.Close(ctx)
			return nil, nil, err
		}
	}
	return conn, func() { conn.Close(ctx) }, nil
}

// sealOn commits Seal's marks and WAL record on conn: the one statement on
// its own, or with the marks in one transaction.
func (l *Ledger) sealOn(ctx context.Context, conn *pgx.Conn, dropped []string) (err error) {
	if l.tracer != nil {
		var span trace.Span
		ctx, span = l.startTx(ctx, "seal snapshot")
		defer func() { endTx(span, err) }()
	}
	if len(dropped) == 0 {
		_, err = conn.Exec(ctx, flushWAL)
		return interpret(err)
	}
	return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := markDropped(ctx, tx, dropped); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, flushWAL)
		return interpret(err)
	})
}

// markDropped sets dropped_at on tokens in tx, waiting at most
// markDroppedLockTimeout for a row (for the rest of tx only).
func markDropped(ctx context.Context, tx pgx.Tx, tokens []string) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, markDroppedLockTimeout); err != nil {
		return interpret(err)
	}
	_, err := tx.Exec(ctx, `UPDATE reservations SET dropped_at = now(), updated_at = now()
		WHERE token = ANY($1) AND status = 'HELD' AND dropped_at IS NULL`, tokens)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return ErrRowsBusy
	}
	return interpret(err)
}

// eachBatch hands rows to fn in batches of at most batch, reusing one slice.
func eachBatch[T any](rows pgx.Rows, batch int, scan func(pgx.Row) (T, error), fn func([]T) error) error {
	defer rows.Close()
	buf := make([]T, 0, max(batch, 1))
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return err
		}
		buf = append(buf, v)
		if len(buf) == cap(buf) {
			if err := fn(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return interpret(err)
	}
	if len(buf) > 0 {
		return fn(buf)
	}
	return nil
}

// WithSnapshot locks a SKU's product row and runs fn with its snapshot while
// holding the lock, so no sale of that SKU can commit between the read and
// whatever fn writes. retention bounds the sales the snapshot streams,
// idempotencyTTL the finished reservations. It returns ErrNotFound for an
// unknown SKU. Snapshots in flight are at most half the pool's connections
// (snapshotSlots); one past them waits for a slot, as long as ctx allows.
func (l *Ledger) WithSnapshot(ctx context.Context, sku string, retention, idempotencyTTL time.Duration, fn func(*Snapshot) error) error {
	select {
	case l.snapshots <- struct{}{}:
		defer func() { <-l.snapshots }()
	case <-ctx.Done():
		return fmt.Errorf("snapshot of %s: waiting for a slot: %w", sku, ctx.Err())
	}
	err := l.inTx(ctx, "snapshot", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		s := &Snapshot{l: l, tx: tx, retention: retention, idempotencyTTL: idempotencyTTL}
		var err error
		s.Product, err = scanProduct(tx.QueryRow(ctx, `SELECT `+productColumns+` FROM products WHERE sku = $1 FOR UPDATE`, sku))
		if err != nil {
			return err
		}
		return fn(s)
	})
	if err != nil {
		return fmt.Errorf("snapshot of %s: %w", sku, err)
	}
	return nil
}

// ReservationsByToken returns the ledger's rows of the given tokens that exist.
func (rs Reservations) ReservationsByToken(ctx context.Context, tokens []string) (map[string]Reservation, error) {
	rows, err := rs.l.pool.Query(ctx, `SELECT `+reservationColumns+` FROM reservations WHERE token = ANY($1)`, tokens)
	if err != nil {
		return nil, fmt.Errorf("reading reservations: %w", interpret(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reservation, error) { return scanReservation(r) })
	if err != nil {
		return nil, fmt.Errorf("reading reservations: %w", err)
	}
	out := make(map[string]Reservation, len(list))
	for _, r := range list {
		out[r.Token] = r
	}
	return out, nil
}

// OverdueHeld lists up to limit reservations the ledger has as HELD whose
// expiry is before the given time and whose token starts with tokenPrefix
// (a partition's tokens share one), by expiry and token, after the keyset
// position (afterExp, afterToken) when afterToken is not "".
//
// The HELD rows' expiries have an index of their own
// (reservations_held_by_expiry): the pass reads only the overdue rows'
// pages, however many SKUs have holds.
func (rs Reservations) OverdueHeld(ctx context.Context, tokenPrefix string, before, afterExp time.Time, afterToken string, limit int) ([]Reservation, error) {
	rows, err := rs.l.pool.Query(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE status = 'HELD' AND expires_at < $1 AND starts_with(token, $2)
		  AND ($3 = '' OR (expires_at, token) > ($4, $3))
		ORDER BY expires_at, token LIMIT $5`, before, tokenPrefix, afterToken, afterExp, limit)
	if err != nil {
		return nil, fmt.Errorf("listing overdue holds: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reservation, error) { return scanReservation(r) })
	if err != nil {
		return nil, fmt.Errorf("listing overdue holds: %w", err)
	}
	return out, nil
}

// IdempotencyUse returns the oldest reservation made with an idempotency
// hash since the given time, whatever its SKU, or ErrNotFound.
func (rs Reservations) IdempotencyUse(ctx context.Context, idemHash string, since time.Time) (Reservation, error) {
	r, err := scanReservation(rs.l.pool.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE idempotency_hash = $1 AND created_at > $2 ORDER BY created_at LIMIT 1`, idemHash, since))
	if err != nil {
		return Reservation{}, fmt.Errorf("looking up idempotency key: %w", err)
	}
	return r, nil
}

// LatestIdempotencyUse returns when the newest reservation made with an
// idempotency key since the given time was made, or ErrNotFound.
func (rs Reservations) LatestIdempotencyUse(ctx context.Context, since time.Time) (time.Time, error) {
	var at *time.Time
	err := rs.l.pool.QueryRow(ctx, `SELECT max(created_at) FROM reservations
		WHERE idempotency_hash IS NOT NULL AND created_at > $1`, since).Scan(&at)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading latest idempotency key use: %w", interpret(err))
	}
	if at == nil {
		return time.Time{}, ErrNotFound
	}
	return *at, nil
}
