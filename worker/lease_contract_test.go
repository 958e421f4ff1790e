package worker

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/scripttest"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/lua"
)

// TestLeaseCallsMatchTheirHeaders runs a worker kind's lease set against
// real Redis (the keeper records the membership and takes every
// partition's lease, renews them a third of a TTL later, and a clean stop
// releases them) and holds every call of the lease scripts to the script's
// header: each KEYS[n] is the key the header names (a lease and its fencing
// counter of one kind, in one partition; the members in partition 0), the
// counts are the header's, and every lease script is exercised.
func TestLeaseCallsMatchTheirHeaders(t *testing.T) {
	t.Parallel()
	rec := scripttest.NewRecorder(lua.Leases)
	env := testenv.Redis(t)
	env.Client.AddHook(rec)
	b := newBundle(t, env.Client, env.Prefix, testenv.Postgres(t), inventory.Config{})
	opts := fastConfig("contract").Options
	opts.LeaseTTL = time.Minute // nothing lapses on its own while the test looks
	opts.setDefaults()
	s := newLeaseSet("sweeper", newKeys(b.engine.Keys()), b.rdb, opts, b.log, prometheus.NewRegistry())
	require.NoError(t, s.check(b.ctx))
	require.Len(t, s.Owned(), inventory.Partitions, "the only member takes every partition")
	// Half a TTL later on the leases' clock, the keeper renews them all.
	for _, l := range s.leases {
		l.now = func() time.Time { return time.Now().Add(opts.LeaseTTL / 2) }
	}
	require.NoError(t, s.check(b.ctx))
	require.Len(t, s.Owned(), inventory.Partitions, "every lease renewed")
	s.releaseAll(b.ctx)
	for p := range inventory.Partitions {
		n, err := b.rdb.Exists(b.ctx, newKeys(b.engine.Keys()).lease(p, "sweeper")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "partition %d's lease released", p)
	}

	calls := rec.Taken()
	for _, problem := range scripttest.Check(t, lua.Leases, nil, b.prefix, calls) {
		t.Error(problem)
	}
	t.Logf("%d calls of the lease scripts checked against their headers", len(calls))

	// The check sees a call that drifts: a recorded acquire with its lease
	// and its fencing counter swapped is refused.
	i := slices.IndexFunc(calls, func(c scripttest.Call) bool { return c.Script == lua.LeaseAcquire })
	require.GreaterOrEqual(t, i, 0)
	swapped := calls[i]
	require.Len(t, swapped.Keys, 2)
	swapped.Keys = []string{swapped.Keys[1], swapped.Keys[0]}
	problems := scripttest.Check(t, lua.Leases, nil, b.prefix, append(slices.Clone(calls), swapped))
	require.True(t, slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, lua.LeaseAcquire+": KEYS[2] is ") }),
		"the lease and its fence swapped, and the check says %q", problems)
}
