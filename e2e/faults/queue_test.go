package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// TestAdmitterKilledMidDrop kills (SIGKILL) the server running a queued
// drop's admission (the only instance: it holds the admitter's lease) while
// the queue is being admitted, then starts another: it takes the lease once
// the dead one's expires, and the admission goes on from the number the
// dead one reached, in ticket order, until every unit has a pass. No
// number is admitted twice or skipped, in Redis and in the ledger, whose
// rows (each ticket's number and pass, and the admission steps recorded)
// agree with Redis row by row.
func TestAdmitterKilledMidDrop(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.Env["DROPLINE_LEASE_TTL"] = "2s"
	const people, units = 50, 30
	sku := skuIn("QKILL", 3)
	victim := s.start("victim")
	var created struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	s.mustGQL(victim, s.token("ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "name": "Queued " + sku, "price": map[string]any{"amount": 999, "currency": "EUR"},
			"stock": units, "queue": map[string]any{"opensAt": time.Now().Add(-time.Second).Format(time.RFC3339), "admitPerMinute": 120}}},
		&created)
	require.Empty(t, created.CreateProduct.UserErrors)
	for i := range people {
		var joined struct {
			JoinQueue struct {
				Ticket struct {
					Number int64 `json:"number"`
				} `json:"ticket"`
				UserErrors []userError `json:"userErrors"`
			} `json:"joinQueue"`
		}
		s.mustGQL(victim, s.token(fmt.Sprintf("waiter-%d", i), false),
			`mutation($sku: ID!) { joinQueue(input: {sku: $sku}) { ticket { number } userErrors { code message } } }`,
			map[string]any{"sku": sku}, &joined)
		require.Empty(t, joined.JoinQueue.UserErrors)
		require.Equal(t, int64(i+1), joined.JoinQueue.Ticket.Number, "first come, first numbered")
	}

	ctx := context.Background()
	q := s.Keys.Base(inventory.PartitionOf(sku)) + "q:sku:" + sku
	through := func() int64 {
		n, _ := s.RDB.HGet(ctx, q, "through").Int64()
		return n
	}
	eventually(t, 30*time.Second, "the victim admits part of the queue", func() (bool, string) {
		n := through()
		return n >= 5 && n < units, fmt.Sprintf("through %d", n)
	})
	victim.kill(t)
	atKill := through()
	killed := time.Now()
	require.Less(t, atKill, int64(units), "killed mid-drop")
	s.start("successor")
	eventually(t, 30*time.Second, "the successor admits the rest", func() (bool, string) {
		n := through()
		return n == units, fmt.Sprintf("through %d", n)
	})
	t.Logf("killed at number %d of %d; the successor admitted the rest %v after the kill", atKill, units, time.Since(killed).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // a step more: still no pass past the units
	require.EqualValues(t, units, through(), "never more passes than units")

	// Redis: one pass per number 1..units, each its ticket's.
	who, err := s.RDB.HGetAll(ctx, s.Keys.Base(inventory.PartitionOf(sku))+"qwho:sku:"+sku).Result()
	require.NoError(t, err)
	passes, err := s.RDB.HGetAll(ctx, s.Keys.Base(inventory.PartitionOf(sku))+"qpass:sku:"+sku).Result()
	require.NoError(t, err)
	require.Len(t, who, people)
	require.Len(t, passes, units)
	admitted := map[int64]string{}
	for p, raw := range passes {
		parts := strings.Split(raw, "|")
		require.Len(t, parts, 4)
		require.Equal(t, who[p], parts[3], "%s's pass is its number's", p)
		n, err := strconv.ParseInt(parts[3], 10, 64)
		require.NoError(t, err)
		_, twice := admitted[n]
		require.False(t, twice, "number %d admitted twice", n)
		admitted[n] = raw
	}
	for n := int64(1); n <= units; n++ {
		require.Contains(t, admitted, n, "number %d skipped", n)
	}

	// The ledger, once the write-behind has caught up: every ticket, every
	// pass as Redis has it, and the admission steps covering 1..units once.
	eventually(t, 30*time.Second, "the ledger has every admission", func() (bool, string) {
		n := s.scalar(`SELECT count(*) FROM queue_tickets WHERE queue_id = $1 AND pass IS NOT NULL`, "sku:"+sku)
		return n == units, fmt.Sprintf("%d passes", n)
	})
	rows, err := s.Pool.Query(ctx, `SELECT principal, number, coalesce(pass, ''), coalesce((extract(epoch FROM pass_expires_at) * 1000)::bigint, 0)
		FROM queue_tickets WHERE queue_id = $1 ORDER BY number`, "sku:"+sku)
	require.NoError(t, err)
	tickets := 0
	for rows.Next() {
		var p, pass string
		var n, exp int64
		require.NoError(t, rows.Scan(&p, &n, &pass, &exp))
		require.Equal(t, who[p], strconv.FormatInt(n, 10), "%s's number in the ledger", p)
		if pass == "" {
			require.Empty(t, passes[p], "%s has a pass in Redis only", p)
		} else {
			require.Equal(t, fmt.Sprintf("%s|%d|A|%d", pass, exp, n), passes[p], "%s's pass in the ledger", p)
		}
		tickets++
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Equal(t, people, tickets)
	require.Equal(t, units, s.scalar(`SELECT admitted_through::int FROM queues WHERE id = $1`, "sku:"+sku))
	steps, err := s.Pool.Query(ctx, `SELECT first_number, last_number FROM queue_movements
		WHERE queue_id = $1 AND kind = 'qadmit' ORDER BY first_number`, "sku:"+sku)
	require.NoError(t, err)
	next, before, after := int64(1), 0, 0
	for steps.Next() {
		var first, last int64
		require.NoError(t, steps.Scan(&first, &last))
		require.Equal(t, next, first, "admission steps follow each other: none lost, none twice")
		next = last + 1
		if last <= atKill {
			before++
		} else {
			after++
		}
	}
	require.NoError(t, steps.Err())
	steps.Close()
	require.EqualValues(t, units+1, next)
	require.Positive(t, before, "steps by the victim")
	require.Positive(t, after, "steps by the successor")
	t.Logf("%d admission steps recorded, %d by the victim, %d by the successor", before+after, before, after)
}
