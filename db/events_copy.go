package db

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// defaultCopyMinRows is the fewest fresh reservations a batch must have for
// its fresh rows to be written by COPY rather than by unnest inserts. When
// COPY cost two round trips more and a goroutine per COPY in pgconn, it
// paid from about 400 rows on (BenchmarkFlusherApply, 2026-12-01: at 500
// the flusher's CPU 5.1-7.1 µs per event by COPY against 12.8-16.3 by
// unnest; at 100 COPY cost more). A copied batch is one round trip now
// (copyExchange), as an unnest batch is, and COPY costs less from 100 rows:
// batches of 100, 150, 200, 250 and 300 fresh holds written both ways into
// two databases alternated, four to six rounds each, the test process's CPU per
// event (medians) 6.8/8.3, 3.9/4.7, 5.0/5.8, 3.7/5.2 and 3.0/4.7 µs by
// COPY/unnest, PostgreSQL's within the noise of each other. Under a steady
// flow of r events a second a flusher's batches are about r times its
// PollInterval (20 ms): below 400 events up to 20,000 a second.
const defaultCopyMinRows = 100

// Binary COPY of the fresh rows. The columns are those of insertMovements
// and insertReservations.
const (
	copyMovements    = `COPY stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at) FROM STDIN (FORMAT binary)`
	copyReservations = `COPY reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
		expires_at, created_at, committed_at, ended_at, extensions) FROM STDIN (FORMAT binary)`
)

// applyRowsCopy is applyRows for a batch with many fresh reservations: one
// explicit transaction on one connection. Its fresh movements and
// reservations are copied in PostgreSQL's binary COPY format, by one simple
// query (BEGIN, the fence, the products' locks, the two COPYs and COMMIT)
// sent with both COPYs' data in one write (copyExchange): one round trip.
// A batch that also has rows that may exist already (upserts, as applyRows
// writes them), or locks of released holds, or the waitlist's or a queue's
// events, sends those first as a pipeline that begins the transaction: two
// round trips. COPY is a plain insert: a fresh row that exists after all
// fails it with a unique violation, the transaction is rolled back, and
// ApplyEvents sends the batch again as upserts, as it does for applyRows'
// plain inserts.
//
// With a non-nil commit and the batch's one round trip, the transaction is
// committed with synchronous_commit off, and the query ends with the WAL's
// insert and flush positions and the session (commitReport), which fill
// commit: the caller acknowledges the batch only once Flushed shows it
// durable (ApplyEventsUnflushed).
func (l *Ledger) applyRowsCopy(ctx context.Context, fence *Fence, fb *foldedBatch,
	freshMoves, otherMoves *moveRows, freshRes, otherRes *reservationRows, commit *Commit,
) (err error) {
	if l.tracer != nil {
		var span trace.Span
		ctx, span = l.startTx(ctx, "apply_events")
		span.SetAttributes(attribute.Int("dropline.events", len(fb.events)), attribute.Bool("dropline.copy", true))
		defer func() { endTx(span, err) }()
	}
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	pg := conn.Conn().PgConn()
	began := false
	defer func() {
		if err != nil && began && !pg.IsClosed() {
			// The transaction failed or was left open: end it, or the
			// connection is of no further use.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, `ROLLBACK`); rerr != nil {
				_ = conn.Conn().Close(rctx)
			}
		}
	}()
	var sql strings.Builder
	locks, literal := lockLiterals(pg, fence, fb)
	unflushed := false
	if !literal || len(otherMoves.ids) > 0 || len(otherRes.toks) > 0 || len(fb.released) > 0 ||
		len(fb.waits) > 0 || len(fb.queued) > 0 {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		queueLocks(b, fence, fb)
		queueUpserts(b, fb, otherMoves, nil, otherRes)
		res := conn.SendBatch(ctx, b)
		began = true
		for range b.Len() {
			if _, err = res.Exec(); err != nil {
				break
			}
		}
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	} else {
		sql.WriteString("BEGIN; ")
		if commit != nil {
			unflushed = true
			sql.WriteString("SET LOCAL synchronous_commit = off; ")
		}
		sql.WriteString(locks)
	}
	var payloads [][]byte
	if len(freshMoves.ids) > 0 {
		sql.WriteString(copyMovements + "; ")
		payloads = append(payloads, freshMoves.encode())
	}
	sql.WriteString(copyReservations + "; COMMIT")
	if unflushed {
		sql.WriteString("; " + commitReport)
	}
	payloads = append(payloads, freshRes.encode())
	began = true
	tags, row, err := copyExchange(ctx, pg, sql.String(), payloads...)
	if err != nil {
		return err
	}
	if !committed(tags, unflushed) || pg.TxStatus() != 'I' {
		return fmt.Errorf("copying reservations: the transaction ended with %q, not COMMIT", tags)
	}
	began = false
	if unflushed {
		c, err := parseCommitReport(row)
		if err != nil {
			// Committed, but where is not known: an error, so that the
			// caller leaves the events pending and applies them again
			// (a no-op) rather than acknowledging them unflushed.
			return fmt.Errorf("the commit's WAL position: %w", err)
		}
		*commit = c
	}
	l.copied.Add(1)
	return nil
}

// lockLiterals is what queueLocks queues for a batch without released
// holds, as SQL with its values written in (quoteLiteral), for a simple
// query. ok is false when they cannot be written so: the server does not
// take backslashes in a string literal as they are
// (standard_conforming_strings off), or a value has a NUL byte, which no
// text can hold and the query's text would end at.
func lockLiterals(pg *pgconn.PgConn, fence *Fence, fb *foldedBatch) (sql string, ok bool) {
	if pg.ParameterStatus("standard_conforming_strings") != "on" {
		return "", false
	}
	var b strings.Builder
	if fence != nil {
		if strings.IndexByte(fence.Name, 0) >= 0 {
			return "", false
		}
		fmt.Fprintf(&b, "SELECT worker_fence(%s, %d); ", quoteLiteral(fence.Name), fence.Token)
	}
	b.WriteString("SELECT lock_products(ARRAY[")
	for i, sku := range fb.skus {
		if strings.IndexByte(sku, 0) >= 0 {
			return "", false
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quoteLiteral(sku))
	}
	b.WriteString("]::text[]); ")
	return b.String(), true
}

// quoteLiteral is s as an SQL string literal, for a server with
// standard_conforming_strings on: between single quotes, each single quote
// doubled, everything else (backslashes too) as it is.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// copyExchange runs sql, a simple query whose COPY ... FROM STDIN statements
// take payloads in order, in one round trip: the query and every COPY's
// data (one CopyData and a CopyDone each) go out in one write, without
// waiting for the server to ask for them, and the results are read up to
// the query's end (ReadyForQuery). The server reads each COPY's data when it
// comes to it; when a statement fails before, the rest of the query is
// skipped and the data that follows is read and ignored, as the protocol
// has it. It returns every command's tag, the values of the last row a
// statement returned (text format), and the first error. A
// connection the exchange could not finish on (a failed write or read, or
// ctx ending) is closed, never left half-way through the protocol.
func copyExchange(ctx context.Context, pg *pgconn.PgConn, sql string, payloads ...[]byte) (tags []string, row [][]byte, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	fe := pg.Frontend()
	fe.Send(&pgproto3.Query{String: sql})
	for _, p := range payloads {
		fe.Send(&pgproto3.CopyData{Data: p})
		fe.Send(&pgproto3.CopyDone{})
	}
	// The write does not watch ctx itself: a deadline stops it when ctx
	// ends (a server that stopped reading, say), and the connection is
	// closed.
	stop := context.AfterFunc(ctx, func() { _ = pg.Conn().SetWriteDeadline(time.Now()) })
	err = fe.Flush()
	if !stop() && err == nil {
		err = ctx.Err()
	}
	finished := false
	defer func() {
		if !finished {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = pg.Close(cctx)
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	var pgErr error
	for {
		msg, err := pg.ReceiveMessage(ctx)
		if err != nil {
			return nil, nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			if pgErr == nil {
				pgErr = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.CommandComplete:
			tags = append(tags, string(m.CommandTag))
		case *pgproto3.DataRow:
			row = make([][]byte, len(m.Values))
			for i, v := range m.Values {
				row[i] = append([]byte(nil), v...)
			}
		case *pgproto3.ReadyForQuery:
			finished = true
			return tags, row, pgErr
		}
	}
}

// copyBuf builds PostgreSQL's binary COPY format: a header, one tuple per
// row (a field count, then each field's length and bytes, -1 for NULL),
// a trailer.
type copyBuf []byte

var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

func newCopyBuf(rows, perRow int) copyBuf {
	return append(make(copyBuf, 0, len(copyHeader)+rows*perRow+2), copyHeader...)
}

func (c copyBuf) tuple(fields int) copyBuf {
	return binary.BigEndian.AppendUint16(c, uint16(fields))
}

func (c copyBuf) text(s string) copyBuf {
	c = binary.BigEndian.AppendUint32(c, uint32(len(s))) //nolint:gosec // a field is far below 2 GiB
	return append(c, s...)
}

// textOrNull is NULL for "", as nullif(…, ”) makes it in the inserts.
func (c copyBuf) textOrNull(s string) copyBuf {
	if s == "" {
		return c.null()
	}
	return c.text(s)
}

func (c copyBuf) int4(v int32) copyBuf {
	c = binary.BigEndian.AppendUint32(c, 4)
	return binary.BigEndian.AppendUint32(c, uint32(v)) //nolint:gosec // the bits of an int4
}

// postgresEpoch is timestamptz's zero: 2000-01-01 UTC, in Unix microseconds.
const postgresEpoch = 946_684_800_000_000

// timestamptz is t in microseconds since postgresEpoch, truncated as pgx
// truncates it for the inserts.
func (c copyBuf) timestamptz(t time.Time) copyBuf {
	c = binary.BigEndian.AppendUint32(c, 8)
	us := t.Unix()*1_000_000 + int64(t.Nanosecond()/1000) - postgresEpoch
	return binary.BigEndian.AppendUint64(c, uint64(us)) //nolint:gosec // the bits of an int8
}

func (c copyBuf) timestamptzOrNull(t *time.Time) copyBuf {
	if t == nil {
		return c.null()
	}
	return c.timestamptz(*t)
}

func (c copyBuf) null() copyBuf { return binary.BigEndian.AppendUint32(c, 0xffffffff) }

func (c copyBuf) end() []byte { return binary.BigEndian.AppendUint16(c, 0xffff) }

// encode is the movements in copyMovements' columns.
func (m *moveRows) encode() []byte {
	c := newCopyBuf(len(m.ids), 160)
	for i := range m.ids {
		c = c.tuple(7).text(m.ids[i]).text(m.skus[i]).text(m.kinds[i]).text(m.tokens[i]).text(m.principals[i]).
			int4(m.qtys[i]).timestamptz(m.ats[i])
	}
	return c.end()
}

// encode is the reservations in copyReservations' columns.
func (r *reservationRows) encode() []byte {
	c := newCopyBuf(len(r.toks), 220)
	for i := range r.toks {
		c = c.tuple(12).text(r.toks[i]).text(r.skus[i]).text(r.who[i]).int4(r.qtys[i]).text(r.statuses[i]).
			textOrNull(r.idem[i]).textOrNull(r.req[i]).timestamptz(r.exps[i]).timestamptz(r.ctds[i]).
			timestamptzOrNull(r.cmts[i]).timestamptzOrNull(r.ends[i]).int4(r.exts[i])
	}
	return c.end()
}
