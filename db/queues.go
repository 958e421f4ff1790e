package db

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewQueue is the admission queue of a product or a drop being created.
type NewQueue struct {
	OpensAt        time.Time
	AdmitPerMinute int
	PassSeconds    int
	// ProofOfWorkBits is the leading zero bits a join's proof must have (0:
	// none).
	ProofOfWorkBits int
	// Seed is the queue's 32 random bytes, which shuffle its pre-queue at
	// OpensAt; its SHA-256 is published at once.
	Seed []byte
	// AccessCodes, when not empty, are the presale codes: a join must bring
	// one, and each is used by the first principal that brings it. Stored
	// hashed.
	AccessCodes []string
}

// Queue is one row of queues.
type Queue struct {
	// ID names the queue: "sku:<sku>" or "drop:<drop>".
	ID              string
	SKU, DropID     string
	OpensAt         time.Time
	AdmitPerMinute  int
	PassSeconds     int
	ProofOfWorkBits int
	// Seed is nil until OpensAt: it is revealed only once the pre-queue it
	// shuffles is closed.
	Seed           []byte
	SeedHash       string
	HasAccessCodes bool
	CreatedAt      time.Time
}

// QueueID is the id of the queue of a product ("sku") or a drop ("drop").
func QueueID(kind, id string) string { return kind + ":" + id }

// AccessCodeHash is how an access code is stored and looked up: hex SHA-256.
func AccessCodeHash(code string) string {
	h := sha256.Sum256([]byte(code))
	return hex.EncodeToString(h[:])
}

func insertQueue(ctx context.Context, tx pgx.Tx, kind, id string, q NewQueue) error {
	if len(q.Seed) != 32 {
		return fmt.Errorf("queue of %s: %w: the seed must be 32 bytes", id, ErrInvalid)
	}
	var sku, drop *string
	if kind == "sku" {
		sku = &id
	} else {
		drop = &id
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO queues (id, sku, drop_id, opens_at, admit_per_minute, pass_seconds, pow_bits, seed, seed_hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		QueueID(kind, id), sku, drop, q.OpensAt, q.AdmitPerMinute, q.PassSeconds, q.ProofOfWorkBits, q.Seed, SeedHash(q.Seed))
	if err != nil {
		return interpret(err)
	}
	for _, c := range q.AccessCodes {
		if _, err := tx.Exec(ctx, `INSERT INTO queue_access_codes (queue_id, code_hash) VALUES ($1, $2)
			ON CONFLICT DO NOTHING`, QueueID(kind, id), AccessCodeHash(c)); err != nil {
			return interpret(err)
		}
	}
	return nil
}

const queueColumns = `id, coalesce(sku, ''), coalesce(drop_id, ''), opens_at, admit_per_minute, pass_seconds, pow_bits,
	CASE WHEN opens_at <= now() THEN seed END, seed_hash,
	EXISTS (SELECT 1 FROM queue_access_codes c WHERE c.queue_id = queues.id), created_at`

func scanQueue(row pgx.Row) (Queue, error) {
	var q Queue
	err := row.Scan(&q.ID, &q.SKU, &q.DropID, &q.OpensAt, &q.AdmitPerMinute, &q.PassSeconds, &q.ProofOfWorkBits,
		&q.Seed, &q.SeedHash, &q.HasAccessCodes, &q.CreatedAt)
	return q, interpret(err)
}

// Queue returns a queue by id; ErrNotFound when there is none.
func (qs Queues) Queue(ctx context.Context, id string) (Queue, error) {
	q, err := scanQueue(qs.l.pool.QueryRow(ctx, `SELECT `+queueColumns+` FROM queues WHERE id = $1`, id))
	if err != nil {
		return Queue{}, fmt.Errorf("reading queue %s: %w", id, err)
	}
	return q, nil
}

// QueuesByID returns the queues of several ids in one statement; an id with
// no queue has no entry.
func (qs Queues) QueuesByID(ctx context.Context, ids []string) ([]Queue, error) {
	rows, err := qs.l.pool.Query(ctx, `SELECT `+queueColumns+` FROM queues WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading queues: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queue, error) { return scanQueue(r) })
	return out, interpret(err)
}

// QueueIDs returns the ids of every queue, in id order, after the id given
// ("" from the start), at most limit.
func (qs Queues) QueueIDs(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := qs.l.pool.Query(ctx, `SELECT id FROM queues WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", interpret(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids, interpret(err)
}

// ClaimAccessCode gives an access code of a queue to a principal: true when
// the code is the queue's and unused or the principal's already, false when
// it is unknown or another principal's.
func (qs Queues) ClaimAccessCode(ctx context.Context, queue, code, principal string) (bool, error) {
	tag, err := qs.l.pool.Exec(ctx, `UPDATE queue_access_codes SET principal = $3, used_at = coalesce(used_at, now())
		WHERE queue_id = $1 AND code_hash = $2 AND (principal IS NULL OR principal = $3)`,
		queue, AccessCodeHash(code), principal)
	if err != nil {
		return false, fmt.Errorf("claiming an access code of %s: %w", queue, interpret(err))
	}
	return tag.RowsAffected() == 1, nil
}
