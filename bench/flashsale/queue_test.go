package flashsale_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench/flashsale"
	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory/queue"
)

// TestQueueRehearsal runs the drop with the queue rehearsal against two real
// servers: 200 people (a fifth polling) and 20 bots (three connections
// each, every abuse) queue for 40 units behind a queue with proof of work
// and access codes, and every check of the verdict must run and pass: the
// admissions in ticket order, the pre-queue recomputed as verify-queue
// does, no hold without a pass, one ticket each, nothing oversold, every
// waiter told SOLD_OUT within a second, the bots' share, every abuse refused.
func TestQueueRehearsal(t *testing.T) {
	testenv.Quiet(t) // every waiter told SOLD_OUT within a second of the last sale
	dbURL := testenv.NewDatabase(t)
	prefix := testenv.Redis(t).Prefix
	a := startApp(t, dbURL, prefix)
	b := startApp(t, dbURL, prefix)

	cfg := flashsale.DefaultConfig()
	cfg.Targets = []string{"http://" + a.Addr(), "http://" + b.Addr()}
	cfg.Secret = []byte(testSecret)
	cfg.Buyers, cfg.Concurrency, cfg.Stock = 50, 24, 40
	cfg.QuietCommits = 0
	cfg.Think = time.Millisecond
	cfg.Mode = flashsale.ModeQueue
	cfg.QueuePeople, cfg.QueueBots, cfg.QueueBotConns = 200, 20, 3
	// The pre-queue's joins must all be in before the opening: under -race
	// on a loaded machine 240 of them have taken 17 s.
	cfg.QueueWindow, cfg.QueueAdmitPerMinute, cfg.QueuePassSeconds = 30*time.Second, 1200, 10
	cfg.QueuePowBits, cfg.QueueAccessCodes = 6, true
	cfg.DatabaseURL = dbURL
	cfg.RunID = "qr"

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := flashsale.NewDriver(ctx, cfg)
	require.NoError(t, err)
	defer d.Close()
	res, err := d.Run(ctx)
	require.NoError(t, err)
	var text strings.Builder
	require.NoError(t, flashsale.WriteText(&text, res))
	t.Log("\n" + text.String())

	require.True(t, res.Verdict.OK, "failed checks: %+v", res.Verdict.Failed())
	q := res.Queue
	require.NotNil(t, q)
	require.Equal(t, 2, q.Servers)
	require.Equal(t, 220, q.Tickets, "one ticket per principal")
	require.Equal(t, q.Early, q.PreQueue)
	require.Equal(t, 40, q.PeopleUnits+q.BotUnits, "every unit sold behind the queue")
	require.Equal(t, 40, res.Queue.Final.Sold)
	require.Equal(t, 40, q.Pollers, "a fifth of the people poll")
	require.True(t, q.LedgerChecked)
	require.Contains(t, q.Verification, "queue sku:QUEUE-qr verified")
	require.Equal(t, q.RepeatJoins, q.RepeatSame)
	require.Equal(t, 40, q.RepeatJoins, "two more joins per bot")
	for _, kind := range []string{flashsale.AbuseNoProof, flashsale.AbuseWrongProof, flashsale.AbuseNoPass,
		flashsale.AbuseForgedPass, flashsale.AbuseOthersPass} {
		require.Positive(t, q.Abuses[kind][map[string]string{
			flashsale.AbuseNoProof: "PROOF_INVALID", flashsale.AbuseWrongProof: "PROOF_INVALID",
			flashsale.AbuseNoPass: "QUEUE_REQUIRED", flashsale.AbuseForgedPass: "PASS_INVALID",
			flashsale.AbuseOthersPass: "PASS_INVALID"}[kind]], kind)
	}
	var names []string
	for _, c := range res.Verdict.Checks {
		if strings.HasPrefix(c.Name, "queue: ") {
			require.False(t, c.Skipped, c.Name)
			names = append(names, c.Name)
		}
	}
	require.Len(t, names, 16)
	var html strings.Builder
	require.NoError(t, flashsale.WriteHTML(&html, res))
	require.Contains(t, html.String(), "<h2>Queue rehearsal</h2>")
}

// consistentQueue is a queue rehearsal that kept every promise: three
// principals in the pre-queue (numbered as the seed says), one after the
// opening, two units sold with their passes, one to the bot.
func consistentQueue() (*flashsale.QueueResult, flashsale.QueueEvidence) {
	seed := make([]byte, 32)
	seed[0] = 7
	sum := sha256.Sum256(seed)
	pre := queue.PreQueueOrder(seed, []string{"p1", "p2", "b1"})
	t0 := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	lq := &flashsale.LedgerQueue{Seed: seed, SeedHash: hex.EncodeToString(sum[:]), PreQueueSize: 3, AdmittedThrough: 2}
	tokens := map[string]string{}
	for i, who := range append(pre, "p3") {
		tk := flashsale.LedgerTicket{Principal: who, Number: int64(i + 1), PreQueue: i < 3}
		if i < 2 {
			tk.Pass, tk.AdmittedAt, tk.PassExpiresAt = "pass-"+who, t0.Add(time.Duration(i)*time.Second), t0.Add(time.Minute)
			tk.SpentAt, tk.SpentFor = t0.Add(5*time.Second), "tok-"+who
			tokens[tk.SpentFor] = who
			lq.Holds = append(lq.Holds, flashsale.LedgerHold{Token: tk.SpentFor, Principal: who, Status: "COMMITTED", CreatedAt: tk.SpentAt})
		}
		lq.Tickets = append(lq.Tickets, tk)
	}
	lq.Admits = []flashsale.LedgerAdmit{{First: 1, Last: 1, At: t0}, {First: 2, Last: 2, At: t0.Add(time.Second)}}
	last := t0.Add(6 * time.Second)
	ev := flashsale.QueueEvidence{
		Bots:      map[string]bool{"p1": false, "p2": false, "p3": false, "b1": true},
		Early:     map[string]bool{"p1": true, "p2": true, "b1": true},
		Numbers:   map[string]int64{},
		Abuses:    map[string]map[string]int{flashsale.AbuseNoPass: {"QUEUE_REQUIRED": 1}, flashsale.AbuseForgedPass: {"PASS_INVALID": 1}},
		Holds:     tokens,
		Committed: map[string]int{}, Unknown: map[string]int{}, APIStatus: map[string]string{},
		LastSale: last, Told: []time.Time{last.Add(200 * time.Millisecond), last.Add(300 * time.Millisecond)},
		API:                flashsale.Stock{Sold: 2, Total: 2},
		APIAdmittedThrough: 2, APISeed: hex.EncodeToString(seed),
		Ledger:  &flashsale.LedgerState{Total: 2, Sold: 2, SalesUnits: 2, Sales: map[string]int{}},
		Settled: true, Queue: lq,
	}
	for _, tk := range lq.Tickets {
		ev.Numbers[tk.Principal] = tk.Number
	}
	for tok := range tokens {
		ev.Committed[tok], ev.Ledger.Sales[tok], ev.APIStatus[tok] = 1, 1, "COMMITTED"
	}
	return &flashsale.QueueResult{SKU: "QUEUE-x"}, ev
}

func failedQueueChecks(checks []flashsale.Check) []string {
	var out []string
	for _, c := range checks {
		if !c.OK && !c.Skipped {
			out = append(out, c.Name)
		}
	}
	return out
}

// TestJudgeQueueFailsOnABrokenQueue feeds the queue verdict one tampered
// ledger or observation at a time: each must fail, naming what it broke.
func TestJudgeQueueFailsOnABrokenQueue(t *testing.T) {
	t.Parallel()
	res, ev := consistentQueue()
	require.Empty(t, failedQueueChecks(flashsale.JudgeQueue(res, ev)), "the consistent queue passes")
	require.Contains(t, res.Verification, "verified: 3 pre-queue tickets")

	cases := map[string]struct {
		breakIt func(ev *flashsale.QueueEvidence)
		failed  string
	}{
		"two pre-queue numbers swapped": {func(ev *flashsale.QueueEvidence) {
			tk := ev.Queue.Tickets
			tk[1].Principal, tk[2].Principal = tk[2].Principal, tk[1].Principal
		}, "queue: pre-queue order equals verify-queue's recomputation"},
		"a seed that does not hash to the published one": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.SeedHash = strings.Repeat("0", 64)
		}, "queue: pre-queue order equals verify-queue's recomputation"},
		"admitted out of ticket order": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Tickets[1].AdmittedAt = ev.Queue.Tickets[0].AdmittedAt.Add(-time.Second)
		}, "queue: admissions in ticket order"},
		"a number skipped": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Admits[1].First, ev.Queue.Admits[1].Last = 3, 3
		}, "queue: admissions in ticket order"},
		"a pass past admittedThrough": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Tickets[3].Pass = "pass-p3"
		}, "queue: admissions in ticket order"},
		"a hold without a pass": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Tickets[1].SpentFor = ""
		}, "queue: no hold without a valid pass"},
		"a hold bought with another's pass": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Holds[0].Principal = "p3"
			ev.Holds[ev.Queue.Holds[0].Token] = "p3"
		}, "queue: no hold without a valid pass"},
		"a hold after its pass expired": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Holds[0].CreatedAt = ev.Queue.Tickets[0].PassExpiresAt.Add(time.Second)
		}, "queue: no hold without a valid pass"},
		"two tickets for one principal": {func(ev *flashsale.QueueEvidence) {
			ev.Queue.Tickets = append(ev.Queue.Tickets, flashsale.LedgerTicket{Principal: "p3", Number: 5})
		}, "queue: at most one ticket per principal"},
		"a repeated join answered another ticket": {func(ev *flashsale.QueueEvidence) {
			ev.RepeatJoins = 1
		}, "queue: at most one ticket per principal"},
		"oversold in the ledger": {func(ev *flashsale.QueueEvidence) {
			ev.Ledger.Held = 1
		}, "queue: no oversell in the ledger"},
		"Redis and the ledger disagree on a hold": {func(ev *flashsale.QueueEvidence) {
			ev.APIStatus[ev.Queue.Holds[0].Token] = "HELD"
		}, "queue: Redis and the ledger agree hold by hold"},
		"a waiter told SOLD_OUT late": {func(ev *flashsale.QueueEvidence) {
			ev.Told[1] = ev.LastSale.Add(1500 * time.Millisecond)
		}, "queue: every waiter told SOLD_OUT within 1 s of the last unit sold"},
		"a waiter never told": {func(ev *flashsale.QueueEvidence) {
			ev.Told[0] = time.Time{}
		}, "queue: every waiter told SOLD_OUT within 1 s of the last unit sold"},
		"the bots bought everything": {func(ev *flashsale.QueueEvidence) {
			// Both units went to the two people, now bots among 100
			// principals: 2 units where 0.06 are expected.
			ev.Bots["p1"], ev.Bots["p2"], ev.Bots["b1"] = true, true, false
			for i := range 96 {
				ev.Bots[fmt.Sprintf("x%d", i)] = false
			}
		}, "queue: bots got no larger a share of the units than of the principals"},
		"a forged pass accepted": {func(ev *flashsale.QueueEvidence) {
			ev.Abuses[flashsale.AbuseForgedPass]["OK"] = 1
		}, "queue: every bot abuse refused with its typed code"},
		"an expired pass refused with the wrong code": {func(ev *flashsale.QueueEvidence) {
			ev.Abuses[flashsale.AbuseExpiredPass] = map[string]int{"PASS_INVALID": 1}
		}, "queue: every bot abuse refused with its typed code"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res, ev := consistentQueue()
			tc.breakIt(&ev)
			require.Contains(t, failedQueueChecks(flashsale.JudgeQueue(res, ev)), tc.failed)
		})
	}
}
