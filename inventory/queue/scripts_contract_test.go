package queue_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/scripttest"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/lua"
)

// TestQueueCallsMatchTheirHeaders runs the queue's life against real Redis
// (a product's queue joined before and after its opening, its pre-queue
// numbered, tickets admitted; a drop's queue; both lost with Redis and
// restored from the ledger) and holds every call the service makes of the
// queue's scripts to the script's header: each KEYS[n] is the key the
// header names, in the queue's partition, the counts are the header's, and
// every script, every alternative key, every mode and every variable tail
// of ARGV is exercised.
func TestQueueCallsMatchTheirHeaders(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		rec := scripttest.NewRecorder(lua.Queue)
		b := setupRecorded(t, backend, rec)
		r := b.queuedProduct(t, "QC-TEE", 5, inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 600_000})
		for i := range 3 {
			_, err := b.queues.Join(b.ctx, buyer(i).ID, r, queue.JoinInput{})
			require.NoError(t, err)
		}
		b.open(t, r)
		_, err := b.queues.Join(b.ctx, buyer(3).ID, r, queue.JoinInput{})
		require.NoError(t, err)
		require.EqualValues(t, 4, b.admit(t, r, 4).Through, "the pre-queue numbered, then every ticket admitted")

		_, err = b.engine.Drops().CreateDrop(b.ctx, admin, inventory.DropInput{ID: "QC-DROP", Name: "Drop QC-DROP", MaxPerUser: 1,
			Queue: &inventory.QueueSettings{OpensAt: time.Now().Add(-time.Second), AdmitPerMinute: 600_000}})
		require.NoError(t, err)
		_, err = b.engine.Catalog().CreateProduct(b.ctx, admin, inventory.ProductInput{SKU: "QC-DROP-A", Name: "Product QC-DROP-A",
			Price: inventory.Money{Amount: 1999, Currency: "EUR"}, Stock: 3, Drop: "QC-DROP"})
		require.NoError(t, err)
		d := queue.Ref{Kind: queue.OfDrop, ID: "QC-DROP"}
		_, err = b.queues.Join(b.ctx, buyer(0).ID, d, queue.JoinInput{})
		require.NoError(t, err)
		require.EqualValues(t, 1, b.admit(t, d, 1).Through)

		// Redis loses the queues: the next steps restore them from the
		// ledger, their tickets in chunks, then their hashes.
		b.drain(t)
		b.wipe(t)
		require.EqualValues(t, 4, b.step(t, r).Through)
		require.EqualValues(t, 1, b.step(t, d).Through)

		calls := rec.Taken()
		for _, problem := range scripttest.Check(t, lua.Queue, queueTails, b.prefix, calls) {
			t.Error(problem)
		}
		t.Logf("%s: %d calls of the queue's scripts checked against their headers", backend, len(calls))

		// The check sees a call that drifts: a recorded join with two of its
		// keys swapped is refused.
		i := slices.IndexFunc(calls, func(c scripttest.Call) bool { return c.Script == lua.JoinQueue })
		require.GreaterOrEqual(t, i, 0)
		swapped := calls[i]
		swapped.Keys = slices.Clone(swapped.Keys)
		swapped.Keys[1], swapped.Keys[2] = swapped.Keys[2], swapped.Keys[1]
		problems := scripttest.Check(t, lua.Queue, queueTails, b.prefix, append(slices.Clone(calls), swapped))
		require.True(t, slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, lua.JoinQueue+": KEYS[2] is ") }),
			"KEYS[2] and KEYS[3] of join_queue swapped, and the check says %q", problems)
	})
}

// queueTails are the ARGV each item of a variable tail of ARGV takes, by
// script, or by script and mode: a principal of a join's batch or of a
// numbering's, six values of a restored ticket.
var queueTails = map[string]int{lua.JoinQueue: 1, lua.NumberQueue: 1, lua.RestoreQueue + " chunk": 6}

// setupRecorded is setup with rec hooked on the client before the engine
// and the queue service start using it.
func setupRecorded(t *testing.T, backend string, rec *scripttest.Recorder) *bundle {
	t.Helper()
	r := testenv.RedisBackend(t, backend)
	r.Client.AddHook(rec)
	pool := testenv.Postgres(t)
	ctx := context.Background()
	e, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: r.Prefix}, r.Client, pool, zerolog.Nop())
	require.NoError(t, err)
	qs := queue.New(queue.Config{Secret: []byte("a test secret of thirty-two bytes!")}, r.Client, e)
	return &bundle{ctx: ctx, engine: e, queues: qs, rdb: r.Client, pool: pool, prefix: r.Prefix}
}
