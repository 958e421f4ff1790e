package flashsale

import (
	"context"
	"fmt"
	"time"
)

// LedgerQueue is a queue's rows in the ledger.
type LedgerQueue struct {
	Seed            []byte
	SeedHash        string
	PreQueueSize    int
	AdmittedThrough int
	Tickets         []LedgerTicket
	Admits          []LedgerAdmit
	Holds           []LedgerHold
}

// LedgerTicket is a queue_tickets row; Number 0 is none.
type LedgerTicket struct {
	Principal     string
	Number        int64
	PreQueue      bool
	Pass          string
	AdmittedAt    time.Time
	PassExpiresAt time.Time
	SpentAt       time.Time
	SpentFor      string
}

// LedgerAdmit is a qadmit row of queue_movements: the numbers one step
// admitted.
type LedgerAdmit struct {
	First, Last int64
	At          time.Time
}

// LedgerHold is a reservations row of the queued SKU.
type LedgerHold struct {
	Token, Principal, Status string
	CreatedAt                time.Time
}

// WaitQueue reads queue sku:<sku>'s rows, waiting (up to timeout) until the
// write-behind has brought the tickets, the admissions and the spent passes
// the API reported: tickets rows, admittedThrough, and spent passes (one
// per hold). It returns the last reading either way; the verdict judges it.
func (r *LedgerReader) WaitQueue(ctx context.Context, sku string, tickets, through, spent int, timeout time.Duration) (*LedgerQueue, error) {
	deadline := time.Now().Add(timeout)
	for {
		lq, err := r.ReadQueue(ctx, sku)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, t := range lq.Tickets {
			if t.SpentFor != "" {
				n++
			}
		}
		if (len(lq.Tickets) >= tickets && lq.AdmittedThrough >= through && n >= spent) || time.Now().After(deadline) {
			return lq, nil
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// ReadQueue reads the ledger's rows of queue sku:<sku> and the SKU's
// reservations in one snapshot, with SQL of its own.
func (r *LedgerReader) ReadQueue(ctx context.Context, sku string) (*LedgerQueue, error) {
	id := "sku:" + sku
	lq := &LedgerQueue{}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
		return nil, err
	}
	var pre *int64
	var through int64
	if err := tx.QueryRow(ctx, `SELECT seed, seed_hash, pre_queue_size, admitted_through FROM queues WHERE id = $1`, id).
		Scan(&lq.Seed, &lq.SeedHash, &pre, &through); err != nil {
		return nil, fmt.Errorf("reading queue %s: %w", id, err)
	}
	if pre != nil {
		lq.PreQueueSize = int(*pre)
	}
	lq.AdmittedThrough = int(through)
	rows, err := tx.Query(ctx, `SELECT principal, coalesce(number, 0), pre_queue, coalesce(pass, ''),
		coalesce(admitted_at, 'epoch'), coalesce(pass_expires_at, 'epoch'), coalesce(spent_at, 'epoch'), coalesce(spent_for, '')
		FROM queue_tickets WHERE queue_id = $1 ORDER BY number NULLS LAST, principal`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var t LedgerTicket
		if err := rows.Scan(&t.Principal, &t.Number, &t.PreQueue, &t.Pass, &t.AdmittedAt, &t.PassExpiresAt, &t.SpentAt, &t.SpentFor); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Tickets = append(lq.Tickets, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT first_number, last_number, occurred_at FROM queue_movements
		WHERE queue_id = $1 AND kind = 'qadmit' ORDER BY occurred_at, first_number`, id)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var a LedgerAdmit
		if err := rows.Scan(&a.First, &a.Last, &a.At); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Admits = append(lq.Admits, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT token, principal, status, created_at FROM reservations WHERE sku = $1 ORDER BY created_at`, sku)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var h LedgerHold
		if err := rows.Scan(&h.Token, &h.Principal, &h.Status, &h.CreatedAt); err != nil {
			rows.Close()
			return nil, err
		}
		lq.Holds = append(lq.Holds, h)
	}
	return lq, rows.Err()
}
