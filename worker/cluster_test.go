package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// The whole group on a three-master Redis Cluster: leases, consumer groups,
// epochs and sweeps all run partition by partition on the shard that owns the
// partition's slot. A sale over eight SKUs (so over several shards): every
// hold ends committed, cancelled or expired, and the ledger agrees with Redis.
func TestGroupOnRedisCluster(t *testing.T) {
	t.Parallel()
	env := testenv.RedisCluster(t)
	b := newBundle(t, env.Client, env.Prefix, testenv.Postgres(t), inventory.Config{})
	skus := make([]string, 8)
	for i := range skus {
		skus[i] = fmt.Sprintf("CLUSTER-%d", i)
		b.product(t, skus[i], 50)
	}
	g, reg := b.startGroup(t, fastConfig("cluster-a"))

	tokens := map[string][]string{}
	commits, cancels := 0, 0
	for _, sku := range skus {
		// Half are committed or cancelled, under a hold long enough for a
		// loaded machine; the other half expire a second after they are made.
		kept := b.reserveMany(t, sku, 20, time.Minute)
		for i, tok := range kept {
			who := inventory.Principal{ID: fmt.Sprintf("u%d", i)}
			if i%2 == 0 {
				_, err := b.engine.Commit(b.ctx, who, tok)
				require.NoError(t, err)
				commits++
			} else {
				_, err := b.engine.Cancel(b.ctx, who, tok)
				require.NoError(t, err)
				cancels++
			}
		}
		tokens[sku] = append(kept, b.reserveManyAs(t, sku, "x", 20, time.Second)...)
	}
	// The rest expire: the sweeper releases them on every shard.
	waitTotal(t, "the sweeper releases every abandoned hold, once", int64(40*len(skus)-commits-cancels), swept(g))
	for _, sku := range skus {
		require.Zero(t, b.stock(t, sku).Held, "%s: every abandoned hold is released", sku)
	}
	b.waitDrained(t, 10*time.Second, "the write-behind drains", g.Flusher)

	total, distinct, byKind := b.movements(t)
	holds := 40 * len(skus)
	require.Equal(t, total, distinct, "no event applied twice")
	require.Equal(t, holds, byKind["reserve"])
	require.Equal(t, commits, byKind["commit"])
	require.Equal(t, cancels, byKind["cancel"])
	require.Equal(t, holds-commits-cancels, byKind["expire"])
	require.EqualValues(t, holds-commits-cancels, metric(t, reg, "dropline_holds_expired_total"))
	for _, sku := range skus {
		b.requireLedgerMatchesRedis(t, sku, tokens[sku])
		s := b.stock(t, sku)
		require.Equal(t, 10, s.Sold)
		require.Equal(t, 40, s.Available)
	}
}
