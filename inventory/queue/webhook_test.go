package queue_test

import (
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/webhook"
)

// queueEvent is a queue webhook event as the ledger recorded it.
type queueEvent struct {
	Type, SKU string
	Data      struct {
		Queue, SKU, Seed, SeedHash string
		Drop                       *string
		PreQueueSize               int64
		From, Through              int64
	}
}

func (b *bundle) queueEvents(t *testing.T) []queueEvent {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT type, sku, payload FROM webhook_events WHERE type LIKE 'queue.%' ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []queueEvent
	for rows.Next() {
		var e queueEvent
		var payload []byte
		require.NoError(t, rows.Scan(&e.Type, &e.SKU, &payload))
		var msg struct {
			Type string
			Data json.RawMessage
		}
		require.NoError(t, json.Unmarshal(payload, &msg))
		require.Equal(t, e.Type, msg.Type)
		require.NoError(t, json.Unmarshal(msg.Data, &e.Data))
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestQueueWebhookEvents: the ledger write that opens a queue sends one
// queue.opened with the revealed seed of the published hash; each
// admission it records sends a queue.admitted, the numbers contiguous from
// 1; replaying what is recorded sends nothing more.
func TestQueueWebhookEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, "single")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ($1, $2, $3)`,
		"http://127.0.0.1:9/queue", webhook.NewSecret(), []string{webhook.QueueOpened, webhook.QueueAdmitted})
	require.NoError(t, err)
	r := b.queuedProduct(t, "Q-HOOK", 4, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 600_000})
	for i := range 5 {
		_, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
		require.NoError(t, err)
	}
	b.drain(t)
	require.Empty(t, b.queueEvents(t), "nothing before the opening")

	b.open(t, r)
	require.Equal(t, int64(4), b.admit(t, r, 4).Through)
	b.drain(t)
	events := b.queueEvents(t)
	require.NotEmpty(t, events)
	opened := events[0]
	require.Equal(t, webhook.QueueOpened, opened.Type)
	require.Equal(t, "Q-HOOK", opened.SKU, "ordered with the product's events")
	require.Equal(t, r.String(), opened.Data.Queue)
	require.Equal(t, "Q-HOOK", opened.Data.SKU)
	require.Nil(t, opened.Data.Drop)
	require.Equal(t, int64(5), opened.Data.PreQueueSize)
	seed, err := hex.DecodeString(opened.Data.Seed)
	require.NoError(t, err)
	require.Equal(t, db.SeedHash(seed), opened.Data.SeedHash, "the revealed seed is the one committed to")
	var hash string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT seed_hash FROM queues WHERE id = $1`, r.String()).Scan(&hash))
	require.Equal(t, hash, opened.Data.SeedHash)

	next := int64(1)
	for _, e := range events[1:] {
		require.Equal(t, webhook.QueueAdmitted, e.Type)
		require.Equal(t, next, e.Data.From, "admissions follow each other")
		require.GreaterOrEqual(t, e.Data.Through, e.Data.From)
		next = e.Data.Through + 1
	}
	require.Equal(t, int64(5), next, "numbers 1 to 4 admitted")

	// What the write-behind does again on a replayed batch changes nothing.
	_, err = b.pool.Exec(b.ctx, `UPDATE queues SET pre_queue_size = coalesce(pre_queue_size, 9),
		admitted_through = greatest(admitted_through, 4) WHERE id = $1`, r.String())
	require.NoError(t, err)
	require.Len(t, b.queueEvents(t), len(events))
}
