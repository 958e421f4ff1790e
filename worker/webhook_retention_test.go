package worker

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/webhook"
)

// TestWebhookRetentionPrunesWhatEnded: the dispatcher deletes, after the
// retention, the deliveries that ended (delivered, dead) and the events no
// delivery names any more; it keeps what is younger, every pending
// delivery however old, and the events those name. Counted by table.
func TestWebhookRetentionPrunesWhatEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A disabled endpoint: nothing is sent, the rows stay as written here.
	var endpoint int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO webhook_endpoints (url, secret, event_types, enabled)
		VALUES ('http://127.0.0.1:1/', $1, $2, false) RETURNING id`, webhook.NewSecret(), webhook.Types).Scan(&endpoint))
	event := func(age time.Duration) int64 {
		var id int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `INSERT INTO webhook_events (type, sku, payload, recorded_at)
			VALUES ('sale.committed', 'S', '{}', now() - make_interval(secs => $1)) RETURNING id`, age.Seconds()).Scan(&id))
		return id
	}
	delivery := func(ev int64, status string, ended time.Duration) {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO webhook_deliveries (endpoint_id, event_id, sku, status, attempts, last_attempt_at, delivered_at)
			VALUES ($1, $2, 'S', $3, 1, now() - make_interval(secs => $4),
				CASE WHEN $3 = 'DELIVERED' THEN now() - make_interval(secs => $4) END)`, endpoint, ev, status, ended.Seconds())
		require.NoError(t, err)
	}
	const day = 24 * time.Hour
	oldDelivered, oldDead := event(3*day), event(3*day)
	delivery(oldDelivered, "DELIVERED", 3*day)
	delivery(oldDead, "DEAD", 2*day)
	oldPending := event(3 * day)
	delivery(oldPending, "PENDING", 3*day) // attempted long ago, retried later: kept
	young := event(3 * day)
	delivery(young, "DELIVERED", time.Hour) // recorded long ago, delivered an hour ago: kept
	event(3 * day)                          // its endpoint was deleted: no delivery names it
	fresh := event(time.Minute)             // no delivery, but younger than the retention
	many := make([]int64, 25)               // more than one batch
	for i := range many {
		many[i] = event(3 * day)
		delivery(many[i], "DELIVERED", 3*day)
	}

	cfg := fastWebhooks("pruner")
	cfg.Retention, cfg.PruneInterval, cfg.PruneBatch = day, 20*time.Millisecond, 10
	d, _ := b.startDispatcher(t, cfg)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	waitUntil(t, 10*time.Second, "the old rows are pruned", func() bool {
		return testutil.ToFloat64(d.pruned.WithLabelValues("events")) >= float64(3+len(many))
	}, tick.C)

	var deliveries []int64
	rows, err := b.pool.Query(b.ctx, `SELECT event_id FROM webhook_deliveries ORDER BY event_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		deliveries = append(deliveries, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{oldPending, young}, deliveries, "the pending delivery and the young one are kept")
	var events []int64
	rows, err = b.pool.Query(b.ctx, `SELECT id FROM webhook_events ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		events = append(events, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{oldPending, young, fresh}, events, "the events still named, and the fresh one")
	require.Equal(t, float64(2+len(many)), testutil.ToFloat64(d.pruned.WithLabelValues("deliveries")))
	require.Equal(t, float64(3+len(many)), testutil.ToFloat64(d.pruned.WithLabelValues("events")))
}
