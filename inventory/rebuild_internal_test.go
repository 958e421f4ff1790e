package inventory

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/lua"
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
			keys := e.keys.stageRebuildKeys(sku)
			stage := func() string {
				res, err := e.run(ctx, lua.StageRebuild, keys, 300)
				require.NoError(t, err)
				require.Equal(t, codeOK, res.code())
				return res.generation()
			}
			chunk := func(gen string, seq int, token, who string) string {
				res, err := e.run(ctx, lua.HydrateSKU, e.keys.hydrateKeys(sku), e.keys.Base(p), sku, gen, seq, 86400, 86400, 300,
					1, token, who, 1, "HELD", int64(4_102_444_800_000), int64(1_700_000_000_000), 0, 0, "", "", 0,
					1, who, 1)
				require.NoError(t, err)
				return string(res.code())
			}
			publish := func(gen string, chunks int) string {
				res, err := e.run(ctx, lua.PublishSKU, e.keys.publishKeys(sku), sku, gen, chunks,
					10, 0, 0, 0, 0, 1, 1, 9)
				require.NoError(t, err)
				return string(res.code())
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
			res, err := e.run(ctx, lua.StageRebuild, keys, 300)
			require.NoError(t, err)
			require.Equal(t, codeExists, res.code(), "nothing is staged over a live SKU")

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
			n, err := r.Client.Exists(ctx, e.keys.Rebuild(sku), e.keys.RebuildQuota(sku)).Result()
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}
