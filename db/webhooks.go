package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Webhook delivery statuses as the ledger stores them (migration 0014).
const (
	WebhookPending   = "PENDING"
	WebhookDelivered = "DELIVERED"
	WebhookDead      = "DEAD"
)

// MaxWebhookEndpoints bounds how many endpoints may exist, so that the
// delivery worker's pass over them stays short.
const MaxWebhookEndpoints = 100

// ErrTooManyEndpoints means MaxWebhookEndpoints exist already.
var ErrTooManyEndpoints = errors.New("too many webhook endpoints")

// WebhookEndpoint is one subscriber of webhook events.
type WebhookEndpoint struct {
	ID  int64
	URL string
	// Secret signs every delivery ("whsec_" and base64).
	Secret string
	// PreviousSecret is the secret Secret replaced, which signs beside it
	// until PreviousSecretUntil; "" when there is none.
	PreviousSecret      string
	PreviousSecretUntil *time.Time
	EventTypes          []string
	Description         string
	Enabled             bool
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// WebhookEndpointUpdate changes some settings of an endpoint; nil fields
// stay as they are. Its subscriptions apply to events recorded after it.
type WebhookEndpointUpdate struct {
	URL    *string
	Secret *string
	// KeepPreviousFor is how long the secret a new Secret replaces keeps
	// signing beside it; 0: it stops at once.
	KeepPreviousFor time.Duration
	EventTypes      []string
	Description     *string
	Enabled         *bool
}

// WebhookDelivery is one event on its way to one endpoint.
type WebhookDelivery struct {
	EndpointID int64
	EventID    int64
	Type       string
	SKU        string
	// Payload is the body sent, exactly: the event as the ledger recorded it.
	Payload       []byte
	RecordedAt    time.Time
	Status        string
	Attempts      int
	NextAttemptAt time.Time
	LastAttemptAt *time.Time
	// LastStatus is the HTTP status of the last attempt, 0 for none (no
	// answer, or no attempt yet).
	LastStatus  int
	LastError   string
	DeliveredAt *time.Time
}

const webhookEndpointColumns = `id, url, secret, event_types, description, enabled, created_at, updated_at,
	coalesce(previous_secret, ''), previous_secret_until`

func scanWebhookEndpoint(row pgx.Row) (WebhookEndpoint, error) {
	var e WebhookEndpoint
	err := row.Scan(&e.ID, &e.URL, &e.Secret, &e.EventTypes, &e.Description, &e.Enabled, &e.CreatedAt, &e.UpdatedAt,
		&e.PreviousSecret, &e.PreviousSecretUntil)
	return e, interpret(err)
}

// Secrets returns the secrets that sign a delivery at now: Secret, and
// PreviousSecret while it is still valid.
func (e WebhookEndpoint) Secrets(now time.Time) []string {
	if e.PreviousSecret != "" && e.PreviousSecretUntil != nil && now.Before(*e.PreviousSecretUntil) {
		return []string{e.Secret, e.PreviousSecret}
	}
	return []string{e.Secret}
}

// CreateWebhookEndpoint subscribes an endpoint; ErrTooManyEndpoints when
// MaxWebhookEndpoints exist. It receives the events recorded from then on.
func (ws Webhooks) CreateWebhookEndpoint(ctx context.Context, e WebhookEndpoint) (WebhookEndpoint, error) {
	out, err := scanWebhookEndpoint(ws.l.pool.QueryRow(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types, description, enabled)
		SELECT $1, $2, $3, $4, $5 WHERE (SELECT count(*) FROM webhook_endpoints) < $6
		RETURNING `+webhookEndpointColumns,
		e.URL, e.Secret, e.EventTypes, e.Description, e.Enabled, MaxWebhookEndpoints))
	if errors.Is(err, ErrNotFound) {
		err = ErrTooManyEndpoints
	}
	if err != nil {
		return WebhookEndpoint{}, fmt.Errorf("creating webhook endpoint: %w", err)
	}
	return out, nil
}

// UpdateWebhookEndpoint changes an endpoint; ErrNotFound when it does not
// exist.
func (ws Webhooks) UpdateWebhookEndpoint(ctx context.Context, id int64, u WebhookEndpointUpdate) (WebhookEndpoint, error) {
	out, err := scanWebhookEndpoint(ws.l.pool.QueryRow(ctx, `
		UPDATE webhook_endpoints SET
			url = coalesce($2, url),
			-- a new secret keeps the one it replaces beside it for $7 seconds
			previous_secret = CASE WHEN $3::text IS NULL OR $3 = secret THEN previous_secret
				WHEN $7 > 0 THEN secret END,
			previous_secret_until = CASE WHEN $3::text IS NULL OR $3 = secret THEN previous_secret_until
				WHEN $7 > 0 THEN now() + make_interval(secs => $7) END,
			secret = coalesce($3, secret),
			event_types = coalesce($4, event_types),
			description = coalesce($5, description),
			enabled = coalesce($6, enabled),
			updated_at = now()
		WHERE id = $1
		RETURNING `+webhookEndpointColumns,
		id, u.URL, u.Secret, u.EventTypes, u.Description, u.Enabled, u.KeepPreviousFor.Seconds()))
	if err != nil {
		return WebhookEndpoint{}, fmt.Errorf("updating webhook endpoint %d: %w", id, err)
	}
	return out, nil
}

// DeleteWebhookEndpoint removes an endpoint and its deliveries, pending and
// dead; ErrNotFound when it does not exist. A send in flight to it finishes,
// and its outcome is recorded nowhere.
func (ws Webhooks) DeleteWebhookEndpoint(ctx context.Context, id int64) (WebhookEndpoint, error) {
	out, err := scanWebhookEndpoint(ws.l.pool.QueryRow(ctx, `DELETE FROM webhook_endpoints WHERE id = $1 RETURNING `+webhookEndpointColumns, id))
	if err != nil {
		return WebhookEndpoint{}, fmt.Errorf("deleting webhook endpoint %d: %w", id, err)
	}
	return out, nil
}

// WebhookEndpoint returns one endpoint.
func (ws Webhooks) WebhookEndpoint(ctx context.Context, id int64) (WebhookEndpoint, error) {
	out, err := scanWebhookEndpoint(ws.l.pool.QueryRow(ctx, `SELECT `+webhookEndpointColumns+` FROM webhook_endpoints WHERE id = $1`, id))
	if err != nil {
		return WebhookEndpoint{}, fmt.Errorf("reading webhook endpoint %d: %w", id, err)
	}
	return out, nil
}

// WebhookEndpoints returns every endpoint (at most MaxWebhookEndpoints), by
// id; with enabledOnly, only the enabled ones.
func (ws Webhooks) WebhookEndpoints(ctx context.Context, enabledOnly bool) ([]WebhookEndpoint, error) {
	rows, err := ws.l.pool.Query(ctx, `SELECT `+webhookEndpointColumns+` FROM webhook_endpoints
		WHERE enabled OR NOT $1 ORDER BY id`, enabledOnly)
	if err != nil {
		return nil, fmt.Errorf("listing webhook endpoints: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WebhookEndpoint, error) { return scanWebhookEndpoint(r) })
	if err != nil {
		return nil, fmt.Errorf("listing webhook endpoints: %w", err)
	}
	return out, nil
}

// ClaimWebhookDeliveries takes up to limit deliveries of an endpoint that
// are due, for owner, until claimFor from now: each the oldest pending
// delivery of its product, not claimed by anyone, its next attempt due.
// While a delivery is claimed or waits for its retry, the later events of
// its product wait behind it, which is what keeps one product's events in
// order; other products go on. Rows claimed by another process at the same
// moment are skipped (SKIP LOCKED), so any number of processes may claim
// at once and each delivery is in flight at most once.
func (ws Webhooks) ClaimWebhookDeliveries(ctx context.Context, endpoint int64, owner string, limit int, claimFor time.Duration) ([]WebhookDelivery, error) {
	rows, err := ws.l.pool.Query(ctx, `
		WITH heads AS (
			SELECT DISTINCT ON (sku) event_id FROM webhook_deliveries
			WHERE endpoint_id = $1 AND status = 'PENDING'
			ORDER BY sku, event_id
		), pick AS (
			-- the conditions on d are checked again on the row's latest
			-- version once it is locked: a claim another process committed
			-- meanwhile is seen.
			SELECT d.endpoint_id, d.event_id FROM webhook_deliveries d JOIN heads h ON d.event_id = h.event_id
			WHERE d.endpoint_id = $1 AND d.status = 'PENDING' AND d.next_attempt_at <= now() AND d.claimed_until < now()
			ORDER BY d.event_id LIMIT $2
			FOR UPDATE OF d SKIP LOCKED
		)
		UPDATE webhook_deliveries d SET claimed_until = now() + make_interval(secs => $4), claimed_by = $3
		FROM pick, webhook_events e
		WHERE d.endpoint_id = pick.endpoint_id AND d.event_id = pick.event_id AND e.id = d.event_id
		RETURNING d.endpoint_id, d.event_id, e.type, d.sku, e.payload::text, e.recorded_at, d.status, d.attempts,
			d.next_attempt_at, d.last_attempt_at, coalesce(d.last_status, 0), coalesce(d.last_error, ''), d.delivered_at`,
		endpoint, limit, owner, claimFor.Seconds())
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries of webhook endpoint %d: %w", endpoint, interpret(err))
	}
	out, err := pgx.CollectRows(rows, scanWebhookDelivery)
	if err != nil {
		return nil, fmt.Errorf("claiming deliveries of webhook endpoint %d: %w", endpoint, interpret(err))
	}
	return out, nil
}

func scanWebhookDelivery(r pgx.CollectableRow) (WebhookDelivery, error) {
	var d WebhookDelivery
	var payload string
	err := r.Scan(&d.EndpointID, &d.EventID, &d.Type, &d.SKU, &payload, &d.RecordedAt, &d.Status, &d.Attempts,
		&d.NextAttemptAt, &d.LastAttemptAt, &d.LastStatus, &d.LastError, &d.DeliveredAt)
	d.Payload = []byte(payload)
	return d, err
}

// WebhookAttempt is the outcome of one attempt to deliver.
type WebhookAttempt struct {
	// Delivered says the endpoint answered 2xx.
	Delivered bool
	// Status is the HTTP status, 0 when there was no answer.
	Status int
	// Error says why the attempt failed ("" when delivered).
	Error string
	// RetryIn is how long until the next attempt, when it failed.
	RetryIn time.Duration
	// MaxAttempts is how many attempts a delivery gets before it is dead.
	MaxAttempts int
}

// RecordWebhookAttempt records the outcome of owner's attempt at a
// delivery it claimed and releases the claim: DELIVERED, or PENDING with its
// next attempt RetryIn from now, or DEAD when this was its last attempt. It
// returns the status the delivery has then; "" when the delivery is gone
// (its endpoint was deleted), is no longer pending (delivered meanwhile),
// or is claimed by another process (this owner's claim lapsed: the other's
// outcome counts).
func (ws Webhooks) RecordWebhookAttempt(ctx context.Context, endpoint, event int64, owner string, a WebhookAttempt) (string, error) {
	var status string
	var lastError *string
	if a.Error != "" {
		lastError = &a.Error
	}
	err := ws.l.pool.QueryRow(ctx, `
		UPDATE webhook_deliveries SET
			attempts = attempts + 1,
			last_attempt_at = now(),
			last_status = nullif($4, 0),
			last_error = $5,
			status = CASE WHEN $3 THEN 'DELIVERED' WHEN attempts + 1 >= $7 THEN 'DEAD' ELSE 'PENDING' END,
			delivered_at = CASE WHEN $3 THEN now() END,
			next_attempt_at = CASE WHEN $3 THEN next_attempt_at ELSE now() + make_interval(secs => $6) END,
			claimed_until = '-infinity'
		WHERE endpoint_id = $1 AND event_id = $2 AND status = 'PENDING' AND (claimed_by = $8 OR claimed_until < now())
		RETURNING status`,
		endpoint, event, a.Delivered, a.Status, lastError, a.RetryIn.Seconds(), a.MaxAttempts, owner).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("recording an attempt at webhook %d for endpoint %d: %w", event, endpoint, interpret(err))
	}
	return status, nil
}

// ReleaseWebhookClaim gives a claimed delivery back unattempted (its send
// was cut short by a stop), so that it is due again at once.
func (ws Webhooks) ReleaseWebhookClaim(ctx context.Context, endpoint, event int64, owner string) error {
	_, err := ws.l.pool.Exec(ctx, `UPDATE webhook_deliveries SET claimed_until = '-infinity'
		WHERE endpoint_id = $1 AND event_id = $2 AND status = 'PENDING' AND claimed_by = $3`, endpoint, event, owner)
	if err != nil {
		return fmt.Errorf("releasing webhook %d for endpoint %d: %w", event, endpoint, interpret(err))
	}
	return nil
}

const webhookDeliveryColumns = `d.endpoint_id, d.event_id, e.type, d.sku, e.payload::text, e.recorded_at, d.status, d.attempts,
	d.next_attempt_at, d.last_attempt_at, coalesce(d.last_status, 0), coalesce(d.last_error, ''), d.delivered_at`

// WebhookDeliveries returns up to limit deliveries of an endpoint with the
// given status, by event id, after the event id given (keyset pages).
func (ws Webhooks) WebhookDeliveries(ctx context.Context, endpoint int64, status string, afterEvent int64, limit int) ([]WebhookDelivery, error) {
	rows, err := ws.l.pool.Query(ctx, `SELECT `+webhookDeliveryColumns+`
		FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
		WHERE d.endpoint_id = $1 AND d.status = $2 AND d.event_id > $3
		ORDER BY d.event_id LIMIT $4`, endpoint, status, afterEvent, limit)
	if err != nil {
		return nil, fmt.Errorf("listing %s webhooks of endpoint %d: %w", status, endpoint, interpret(err))
	}
	out, err := pgx.CollectRows(rows, scanWebhookDelivery)
	if err != nil {
		return nil, fmt.Errorf("listing %s webhooks of endpoint %d: %w", status, endpoint, interpret(err))
	}
	return out, nil
}

// RedeliverWebhooks makes dead deliveries of an endpoint pending again,
// due at once with a fresh count of attempts: the given events, or every
// dead one when events is nil. It returns how many it revived. A revived
// delivery is sent after the pending ones of its product before it, and
// may arrive after later events of its product that were delivered while
// it was dead.
func (ws Webhooks) RedeliverWebhooks(ctx context.Context, endpoint int64, events []int64) (int, error) {
	tag, err := ws.l.pool.Exec(ctx, `
		UPDATE webhook_deliveries SET status = 'PENDING', attempts = 0, next_attempt_at = now(), claimed_until = '-infinity'
		WHERE endpoint_id = $1 AND status = 'DEAD' AND ($2::bigint[] IS NULL OR event_id = ANY($2))`, endpoint, events)
	if err != nil {
		return 0, fmt.Errorf("redelivering webhooks of endpoint %d: %w", endpoint, interpret(err))
	}
	return int(tag.RowsAffected()), nil
}

// WebhookBacklog is what waits at one endpoint.
type WebhookBacklog struct {
	EndpointID int64
	Pending    int
	Dead       int
	// OldestPending is when the oldest pending event was recorded; zero
	// when none is pending.
	OldestPending time.Time
}

// WebhookBacklogs returns every endpoint's backlog, by id.
func (ws Webhooks) WebhookBacklogs(ctx context.Context) ([]WebhookBacklog, error) {
	rows, err := ws.l.pool.Query(ctx, `
		SELECT w.id,
			(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = w.id AND d.status = 'PENDING'),
			(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = w.id AND d.status = 'DEAD'),
			(SELECT e.recorded_at FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
				WHERE d.endpoint_id = w.id AND d.status = 'PENDING' ORDER BY d.event_id LIMIT 1)
		FROM webhook_endpoints w ORDER BY w.id`)
	if err != nil {
		return nil, fmt.Errorf("reading webhook backlogs: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WebhookBacklog, error) {
		var b WebhookBacklog
		var oldest *time.Time
		err := r.Scan(&b.EndpointID, &b.Pending, &b.Dead, &oldest)
		if oldest != nil {
			b.OldestPending = *oldest
		}
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading webhook backlogs: %w", interpret(err))
	}
	return out, nil
}

// PruneWebhooks deletes up to limit deliveries that ended (DELIVERED, or
// DEAD and not redelivered) longer than olderThan ago, then up to limit
// events recorded longer than olderThan ago that no delivery names any
// more, and returns how many of each it deleted. A pending delivery and its
// event are never deleted, however old. The conditions are checked again
// on each row as it is deleted, so a dead letter redelivered at that moment
// stays.
func (ws Webhooks) PruneWebhooks(ctx context.Context, olderThan time.Duration, limit int) (deliveries, events int, err error) {
	tag, err := ws.l.pool.Exec(ctx, `
		DELETE FROM webhook_deliveries d
		WHERE (d.endpoint_id, d.event_id) IN (
				SELECT endpoint_id, event_id FROM webhook_deliveries
				WHERE status <> 'PENDING' AND coalesce(delivered_at, last_attempt_at) < now() - make_interval(secs => $1)
				LIMIT $2)
			AND d.status <> 'PENDING' AND coalesce(d.delivered_at, d.last_attempt_at) < now() - make_interval(secs => $1)`,
		olderThan.Seconds(), limit)
	if err != nil {
		return 0, 0, fmt.Errorf("pruning webhook deliveries: %w", interpret(err))
	}
	deliveries = int(tag.RowsAffected())
	tag, err = ws.l.pool.Exec(ctx, `
		DELETE FROM webhook_events e
		WHERE e.id IN (
				SELECT id FROM webhook_events ev
				WHERE ev.recorded_at < now() - make_interval(secs => $1)
					AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = ev.id)
				ORDER BY id LIMIT $2)
			AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)`,
		olderThan.Seconds(), limit)
	if err != nil {
		return deliveries, 0, fmt.Errorf("pruning webhook events: %w", interpret(err))
	}
	return deliveries, int(tag.RowsAffected()), nil
}
