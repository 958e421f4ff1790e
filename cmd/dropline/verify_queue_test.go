package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// TestVerifyQueue runs verify-queue before the opening (refused: the seed
// is secret), on a pre-queue of 3,000 numbered at the opening (verified),
// and after two numbers are swapped in Redis (not verified).
func TestVerifyQueue(t *testing.T) {
	t.Parallel()
	const sku = "VQ-1"
	s := newVerifySetup(t, inventory.ProductInput{
		SKU: sku, Name: "Queued", Price: inventory.Money{Amount: 100, Currency: "EUR"}, Stock: 10,
		Queue: &inventory.QueueSettings{OpensAt: time.Now().Add(time.Hour), AdmitPerMinute: 60},
	})
	ctx, dbURL, r, pool, e := s.ctx, s.dbURL, s.r, s.pool, s.e
	ref := queue.Ref{Kind: queue.OfProduct, ID: sku}
	qs := queue.New(queue.Config{}, r.Client, e)
	for i := range 3000 {
		_, err := qs.Join(ctx, fmt.Sprintf("w-%d", i), ref, queue.JoinInput{})
		require.NoError(t, err)
	}
	envm := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": os.Getenv("REDIS_URL"), "DROPLINE_KEY_PREFIX": r.Prefix, "DROPLINE_DEV": "1"}
	code, _, errOut := runCmd(t, envm, "verify-queue", "--sku", sku)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "revealed only then")

	// The opening comes (the scripts read Redis' clock, which a test cannot move).
	_, err := pool.Exec(ctx, `UPDATE queues SET opens_at = now() WHERE id = $1`, ref.String())
	require.NoError(t, err)
	base := e.Keys().Base(inventory.PartitionOf(sku))
	require.NoError(t, r.Client.HSet(ctx, base+"q:"+ref.String(), "opens", time.Now().Add(-time.Second).UnixMilli()).Err())
	_, err = qs.Step(ctx, ref)
	require.NoError(t, err)

	code, out, errOut := runCmd(t, envm, "verify-queue", "--sku", sku)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "queue sku:VQ-1 verified: 3000 pre-queue tickets")
	t.Log(out)

	one, two := r.Client.HGet(ctx, base+"qnum:"+ref.String(), "1").Val(), r.Client.HGet(ctx, base+"qnum:"+ref.String(), "2").Val()
	require.NoError(t, r.Client.HSet(ctx, base+"qnum:"+ref.String(), "1", two, "2", one).Err())
	code, _, errOut = runCmd(t, envm, "verify-queue", "--sku", sku)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not the ones its seed gives")
}
