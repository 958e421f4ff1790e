package db

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// defaultCopyMinRows is the fewest fresh reservations a batch must have for
// its fresh rows to be written by COPY rather than by unnest inserts. COPY
// costs two round trips more and a goroutine per COPY in pgconn: measured
// with BenchmarkFlusherApply, old and new builds alternated, a batch of 500
// fresh holds cost the flusher's process 5.1-7.1 µs of CPU per event by
// COPY against 12.8-16.3 by unnest, while at 100 COPY cost more (16-24
// against 12-20 µs) and applied fewer per second. Full batches (500, the
// default BatchSize) are what a flusher that has fallen behind applies.
const defaultCopyMinRows = 400

// Binary COPY of the fresh rows. The columns are those of insertMovements
// and insertReservations.
const (
	copyMovements    = `COPY stock_movements (event_id, sku, kind, token, principal, quantity, occurred_at) FROM STDIN (FORMAT binary)`
	copyReservations = `COPY reservations (token, sku, principal, quantity, status, idempotency_hash, request_hash,
		expires_at, created_at, committed_at, ended_at, extensions) FROM STDIN (FORMAT binary)`
)

// applyRowsCopy is applyRows for a batch with many fresh reservations: one
// explicit transaction on one connection, in three round trips. The first
// is a pipeline that begins it, checks the fence, takes the locks and
// writes the rows that may exist already (upserts, as applyRows does); the
// second copies the fresh movements in PostgreSQL's binary COPY format; the
// third copies the fresh reservations and commits. COPY is a plain insert:
// a fresh row that exists after all fails it with a unique violation, the
// transaction is rolled back, and ApplyEvents sends the batch again as
// upserts, as it does for applyRows' plain inserts.
func (l *Ledger) applyRowsCopy(ctx context.Context, fence *Fence, fb *foldedBatch,
	freshMoves, otherMoves *moveRows, freshRes, otherRes *reservationRows,
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
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	queueLocks(b, fence, fb)
	queueUpserts(b, fb, otherMoves, nil, otherRes)
	began := false
	defer func() {
		if err != nil && began {
			// The transaction failed or was left open: end it, or the
			// connection is of no further use.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, `ROLLBACK`); rerr != nil {
				_ = conn.Conn().Close(rctx)
			}
		}
	}()
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
	pg := conn.Conn().PgConn()
	if len(freshMoves.ids) > 0 {
		if _, err = pg.CopyFrom(ctx, newCopyReader(freshMoves.encode()), copyMovements); err != nil {
			return err
		}
	}
	// The COPY and the COMMIT in one simple query: PostgreSQL runs the
	// COMMIT once the COPY is done, and skips it when the COPY fails.
	tag, err := pg.CopyFrom(ctx, newCopyReader(freshRes.encode()), copyReservations+`; COMMIT`)
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("copying reservations: the transaction ended with %q, not COMMIT", tag.String())
	}
	began = false
	l.copied.Add(1)
	return nil
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

// copyReader reads a prepared COPY payload once.
type copyReader struct{ b []byte }

func newCopyReader(b []byte) *copyReader { return &copyReader{b: b} }

func (r *copyReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}
