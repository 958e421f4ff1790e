package live_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
)

// A SKU whose sequence is past what a float64 holds exactly (2^53) is still
// delivered change by change: the hub reads an announcement's seq as the
// integer Redis published, so a change one above the last is newer, not
// the same value again. The periodic re-read is an hour away: a change is
// delivered by its announcement or not at all.
func TestSequencePastTwoToThe53IsFollowed(t *testing.T) {
	t.Parallel()
	for _, backend := range testenv.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			b := setupBackend(t, backend, live.HubConfig{ResyncInterval: time.Hour})
			b.product(t, "BIGSEQ", 10)
			require.NoError(t, b.rdb.HSet(b.ctx, b.engine.Keys().SKU("BIGSEQ"), "seq", "9007199254740992").Err())
			ctx, cancel := context.WithCancel(b.ctx)
			defer cancel()
			ch, err := b.hub.Subscribe(ctx, []string{"BIGSEQ"})
			require.NoError(t, err)
			c := collect(ch)
			first := b.truth(t, "BIGSEQ")
			require.EqualValues(t, 9007199254740992, first.Seq)
			c.waitFor(t, 5*time.Second, func() bool { v, ok := c.lastOf("BIGSEQ"); return ok && same(v, first) },
				"the subscriber never had %+v", first)

			for i := range 3 {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "BIGSEQ", Quantity: 1})
				require.NoError(t, err)
				truth := b.truth(t, "BIGSEQ")
				d := c.waitFor(t, 5*time.Second, func() bool { v, ok := c.lastOf("BIGSEQ"); return ok && same(v, truth) },
					"after reserve %d the subscriber never had %+v", i, truth)
				t.Logf("reserve %d: seq %d delivered after %s", i, truth.Seq, d)
			}
		})
	}
}
