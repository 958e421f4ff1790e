package inventory

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory/script"
)

// A rebuild that lost its Postgres lock (its connection died, its process
// paused) may still send chunks after a newer rebuild staged. Those chunks,
// and its publish, write nothing; a chunk retried by the Redis client after
// a lost reply is written once; what the loser wrote before it was replaced
// does not count.
func TestSupersededRebuildWritesNothing(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			r := testenv.RedisBackend(t, backend)
			ctx := context.Background()
			e, err := NewEngine(ctx, Config{KeyPrefix: r.Prefix}, r.Client, testenv.Postgres(t), zerolog.Nop())
			require.NoError(t, err)
			const sku = "STALE-1"
			p := PartitionOf(sku)
			stage := func() string {
				res, err := script.RunStageRebuild(ctx, e.run, e.keys, script.StageRebuild{SKU: sku, StagingTTL: 300})
				require.NoError(t, err)
				require.Equal(t, codeOK, replyCode(res.Code))
				return res.Generation
			}
			chunk := func(gen string, seq int, token, who string) string {
				res, err := script.RunHydrateSKU(ctx, e.run, e.keys, script.HydrateSKU{SKU: sku, Generation: gen, Chunk: seq,
					Retention: 86400, IdempotencyTTL: 86400, StagingTTL: 300,
					Holds: []script.HydrateHold{{Token: token, Principal: who, Quantity: 1, Status: "HELD",
						ExpiresMs: 4_102_444_800_000, CreatedMs: 1_700_000_000_000}},
					Quota: []script.QuotaCount{{Principal: who, Units: 1}}})
				require.NoError(t, err)
				return res.Code
			}
			publish := func(gen string, chunks int) string {
				res, err := script.RunPublishSKU(ctx, e.run, e.keys, script.PublishSKU{SKU: sku, Generation: gen, Chunks: chunks,
					Total: 10, Version: 1, Held: 1, Available: 9})
				require.NoError(t, err)
				return res.Code
			}
			loserTok, winnerTok := newToken(p), newToken(p)

			loser := stage()
			require.Equal(t, "OK", chunk(loser, 0, loserTok, "alice"))
			winner := stage()
			require.NotEqual(t, loser, winner)
			require.Equal(t, "STALE", chunk(loser, 1, loserTok, "alice"), "the loser writes nothing more")
			require.Equal(t, "STALE", publish(loser, 1))
			require.Equal(t, "OK", chunk(winner, 0, winnerTok, "bob"))
			require.Equal(t, "DONE", chunk(winner, 0, winnerTok, "bob"), "a retried chunk is written once")
			require.Equal(t, "STALE", chunk(winner, 2, winnerTok, "bob"), "a chunk out of order is refused")
			require.Equal(t, "STALE", publish(winner, 2), "a publish missing a chunk is refused")
			require.Equal(t, "OK", publish(winner, 1))
			require.Equal(t, "EXISTS", chunk(loser, 1, loserTok, "alice"))
			require.Equal(t, "EXISTS", publish(winner, 1))
			res, err := script.RunStageRebuild(ctx, e.run, e.keys, script.StageRebuild{SKU: sku, StagingTTL: 300})
			require.NoError(t, err)
			require.Equal(t, codeExists, replyCode(res.Code), "nothing is staged over a live SKU")

			quota, err := r.Client.HGetAll(ctx, e.keys.Quota(sku)).Result()
			require.NoError(t, err)
			require.Equal(t, map[string]string{"bob": "1"}, quota, "only the winner's counts, once")
			gen, err := r.Client.HGet(ctx, e.keys.SKU(sku), "gen").Result()
			require.NoError(t, err)
			require.Equal(t, winner, gen)
			loserGen, err := r.Client.HGet(ctx, e.keys.Hold(p, loserTok), "gen").Result()
			require.NoError(t, err)
			require.Equal(t, loser, loserGen, "the loser's hold is of no life of the SKU")
			ttl, err := r.Client.TTL(ctx, e.keys.Hold(p, loserTok)).Result()
			require.NoError(t, err)
			require.Positive(t, ttl, "and it does not stay for ever")
			n, err := r.Client.Exists(ctx, e.keys.Staged().Rebuild(sku), e.keys.Staged().Quota(sku)).Result()
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}
