package flashsale

import (
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dropline/dropline/inventory/queue"
)

// soldOutCheckBound is how soon every waiter must learn SOLD_OUT (G15).
const soldOutCheckBound = time.Second

// JudgeQueue checks a queue rehearsal: admissions in ticket order (the
// ledger's passes are numbers 1..admittedThrough, admitted in that order,
// the admission steps contiguous); the pre-queue numbered as the
// verification `dropline verify-queue` runs recomputes it from the revealed
// seed (queue.CheckPreQueueOrder); no hold without a valid pass (every hold
// in the ledger spent an admitted, unexpired pass of its own principal);
// one ticket per principal; no unit oversold and Redis and the ledger
// agreeing hold by hold (Judge's checks, and each hold's status through the
// API); every websocket waiter told SOLD_OUT within a second of the last
// sale; the bots' units within a binomial 3-sigma bound of their share of
// principals; and every abuse refused with its code.
func JudgeQueue(res *QueueResult, ev QueueEvidence) []Check {
	var checks []Check
	add := func(name string, ok bool, format string, args ...any) {
		checks = append(checks, Check{Name: "queue: " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	skip := func(name string) {
		checks = append(checks, Check{Name: "queue: " + name, Skipped: true, Detail: "ledger not read (--no-ledger)"})
	}
	lq := ev.Queue
	if lq != nil {
		res.PreQueue, res.Tickets, res.AdmittedThrough = lq.PreQueueSize, len(lq.Tickets), lq.AdmittedThrough
	}

	// Admissions in ticket order.
	if lq == nil {
		skip("admissions in ticket order")
	} else {
		var bad []string
		var prev time.Time
		passes := 0
		for _, t := range lq.Tickets {
			switch {
			case t.Pass != "" && (t.Number < 1 || t.Number > int64(lq.AdmittedThrough)):
				bad = append(bad, fmt.Sprintf("%s holds a pass at number %d, past %d", t.Principal, t.Number, lq.AdmittedThrough))
			case t.Pass == "" && t.Number >= 1 && t.Number <= int64(lq.AdmittedThrough):
				bad = append(bad, fmt.Sprintf("number %d (%s) admitted without a pass", t.Number, t.Principal))
			case t.Pass != "" && t.AdmittedAt.Before(prev):
				bad = append(bad, fmt.Sprintf("number %d admitted at %s, before a number ahead of it", t.Number, t.AdmittedAt.Format(time.StampMilli)))
			}
			if t.Pass != "" {
				passes++
				prev = t.AdmittedAt
			}
		}
		next := int64(1)
		for _, a := range lq.Admits {
			if a.First != next || a.Last < a.First {
				bad = append(bad, fmt.Sprintf("a step admitted %d-%d after %d", a.First, a.Last, next-1))
			}
			next = max(next, a.Last+1)
		}
		if next-1 != int64(lq.AdmittedThrough) || passes != lq.AdmittedThrough || ev.APIAdmittedThrough != lq.AdmittedThrough {
			bad = append(bad, fmt.Sprintf("steps admitted through %d, %d passes, ledger through %d, API through %d",
				next-1, passes, lq.AdmittedThrough, ev.APIAdmittedThrough))
		}
		add("admissions in ticket order", len(bad) == 0, "numbers 1-%d admitted in %d steps, each from the number after the last, admitted_at rising with the number%s",
			lq.AdmittedThrough, len(lq.Admits), sample(bad))
	}

	// The pre-queue, recomputed as verify-queue does.
	if lq == nil {
		skip("pre-queue order equals verify-queue's recomputation")
	} else {
		var members, bad []string
		for _, t := range lq.Tickets {
			inPre := t.Number >= 1 && t.Number <= int64(lq.PreQueueSize)
			if inPre != t.PreQueue {
				bad = append(bad, fmt.Sprintf("%s: number %d, pre_queue %v", t.Principal, t.Number, t.PreQueue))
			}
			if inPre {
				members = append(members, t.Principal)
			}
			if t.PreQueue != ev.Early[t.Principal] {
				bad = append(bad, fmt.Sprintf("%s: pre_queue %v, joined before the opening %v", t.Principal, t.PreQueue, ev.Early[t.Principal]))
			}
		}
		err := queue.CheckPreQueueOrder(lq.Seed, lq.SeedHash, members)
		if err == nil {
			res.Verification = fmt.Sprintf("queue sku:%s verified: %d pre-queue tickets numbered as seed %.16s... gives", res.SKU, len(members), lq.SeedHash)
		} else {
			res.Verification = err.Error()
		}
		if ev.APISeed != hex.EncodeToString(lq.Seed) {
			bad = append(bad, fmt.Sprintf("the API revealed the seed %q, not the ledger's", ev.APISeed))
		}
		if len(ev.Early) != lq.PreQueueSize || len(members) != lq.PreQueueSize {
			bad = append(bad, fmt.Sprintf("%d joined before the opening, the ledger's pre-queue is %d with %d numbered", len(ev.Early), lq.PreQueueSize, len(members)))
		}
		add("pre-queue order equals verify-queue's recomputation", err == nil && len(bad) == 0, "%s%s", res.Verification, sample(bad))
	}

	// No hold without a valid pass, row by row.
	if lq == nil {
		skip("no hold without a valid pass")
	} else {
		spentFor := map[string]LedgerTicket{}
		spent := 0
		for _, t := range lq.Tickets {
			if t.SpentFor != "" {
				spent++
				spentFor[t.SpentFor] = t
			}
		}
		var bad []string
		for _, h := range lq.Holds {
			t, ok := spentFor[h.Token]
			switch {
			case !ok:
				bad = append(bad, h.Token+" spent no pass")
			case t.Principal != h.Principal:
				bad = append(bad, fmt.Sprintf("%s (%s) spent %s's pass", h.Token, h.Principal, t.Principal))
			case t.Pass == "" || t.Number < 1:
				bad = append(bad, h.Token+" spent a ticket without a pass")
			case h.CreatedAt.Before(t.AdmittedAt) || t.SpentAt.After(t.PassExpiresAt) || h.CreatedAt.After(t.PassExpiresAt):
				bad = append(bad, fmt.Sprintf("%s held at %s with a pass admitted %s, expiring %s", h.Token,
					h.CreatedAt.Format(time.StampMilli), t.AdmittedAt.Format(time.StampMilli), t.PassExpiresAt.Format(time.StampMilli)))
			}
		}
		if spent != len(lq.Holds) {
			bad = append(bad, fmt.Sprintf("%d passes spent for %d holds", spent, len(lq.Holds)))
		}
		add("no hold without a valid pass", len(bad) == 0, "%d holds in the ledger, each bought with its holder's pass, admitted before and unexpired at the hold%s",
			len(lq.Holds), sample(bad))
	}

	// One ticket per principal.
	var bad []string
	for _, c := range ev.Conflicts {
		bad = append(bad, "the API gave "+c)
	}
	if ev.RepeatSame != ev.RepeatJoins {
		bad = append(bad, fmt.Sprintf("%d of %d repeated joins answered another ticket", ev.RepeatJoins-ev.RepeatSame, ev.RepeatJoins))
	}
	detail := fmt.Sprintf("%d principals joined; %d of %d repeated joins answered the first ticket", len(ev.Numbers), ev.RepeatSame, ev.RepeatJoins)
	if lq != nil {
		seen, numbers := map[string]bool{}, map[int64]string{}
		for _, t := range lq.Tickets {
			if seen[t.Principal] {
				bad = append(bad, t.Principal+" has two tickets")
			}
			seen[t.Principal] = true
			if _, ok := ev.Bots[t.Principal]; !ok {
				bad = append(bad, t.Principal+" is not a principal of this run")
			}
			if t.Number > 0 {
				if o, dup := numbers[t.Number]; dup {
					bad = append(bad, fmt.Sprintf("number %d is %s's and %s's", t.Number, o, t.Principal))
				}
				numbers[t.Number] = t.Principal
			}
			if n, ok := ev.Numbers[t.Principal]; ok && n != 0 && n != t.Number {
				bad = append(bad, fmt.Sprintf("%s: the API said %d, the ledger %d", t.Principal, n, t.Number))
			}
		}
		for who := range ev.Numbers {
			if !seen[who] {
				bad = append(bad, who+" joined but has no ticket in the ledger")
			}
		}
		detail += fmt.Sprintf("; the ledger has %d tickets, %d numbered, each principal and number once", len(lq.Tickets), len(numbers))
	}
	add("at most one ticket per principal", len(bad) == 0, "%s%s", detail, sample(bad))

	// No unit oversold: the drop's checks on the queued SKU, then each hold
	// as Redis and the ledger have it.
	v := Judge(VerdictInput{Observed: Observed{Committed: ev.Committed, Unknown: ev.Unknown,
		Samples: append(slices.Clone(ev.Samples), StockSample{Stock: ev.API})}, API: ev.API, Ledger: ev.Ledger, Settled: ev.Settled})
	for _, c := range v.Checks {
		c.Name = "queue: " + c.Name
		checks = append(checks, c)
	}
	if lq == nil {
		skip("Redis and the ledger agree hold by hold")
	} else {
		bad = nil
		inLedger := map[string]bool{}
		for _, h := range lq.Holds {
			inLedger[h.Token] = true
			if who, ok := ev.Holds[h.Token]; !ok || who != h.Principal {
				bad = append(bad, fmt.Sprintf("%s (%s) was given to no principal of the run", h.Token, h.Principal))
			} else if st := ev.APIStatus[h.Token]; st != h.Status {
				bad = append(bad, fmt.Sprintf("%s: API %s, ledger %s", h.Token, st, h.Status))
			}
		}
		for tok := range ev.Holds {
			if !inLedger[tok] {
				bad = append(bad, tok+" is not in the ledger")
			}
		}
		add("Redis and the ledger agree hold by hold", len(bad) == 0, "%d holds given, %d in the ledger, each with the status the API reads from Redis%s",
			len(ev.Holds), len(lq.Holds), sample(bad))
	}

	// Every waiter told SOLD_OUT within a second of the last sale.
	var late []time.Duration
	never := 0
	for _, at := range ev.Told {
		if at.IsZero() {
			never++
			continue
		}
		late = append(late, at.Sub(ev.LastSale))
	}
	res.Watching, res.Told, res.SoldOutLate = len(ev.Told), len(late), quantiles(late)
	soldOut := ev.API.Total > 0 && ev.API.Sold == ev.API.Total
	add("every waiter told SOLD_OUT within 1 s of the last unit sold",
		soldOut && never == 0 && len(late) > 0 && res.SoldOutLate.MaxMs <= ms(soldOutCheckBound),
		"sold %d of %d; %d of %d websocket waiters told, from the last commit's answer p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d of %d polling waiters told at their next poll",
		ev.API.Sold, ev.API.Total, len(late), len(ev.Told), res.SoldOutLate.P50ms, res.SoldOutLate.P99ms, res.SoldOutLate.MaxMs,
		res.PollersTold, res.PollersWaiting)

	// The bots' share of the units.
	if lq == nil {
		skip("bots got no larger a share of the units than of the principals")
	} else {
		bots := 0
		for _, isBot := range ev.Bots {
			if isBot {
				bots++
			}
		}
		res.BotUnits, res.PeopleUnits = 0, 0
		for _, h := range lq.Holds {
			if h.Status != "COMMITTED" {
				continue
			}
			if ev.Bots[h.Principal] {
				res.BotUnits++
			} else {
				res.PeopleUnits++
			}
		}
		sold := res.BotUnits + res.PeopleUnits
		p := float64(bots) / float64(max(1, len(ev.Bots)))
		res.BotBound = binomialBound(sold, p)
		add("bots got no larger a share of the units than of the principals", float64(res.BotUnits) <= res.BotBound,
			"bots are %d of %d principals (%.1f %%) and bought %d of %d units (%.1f %%); at most %.1f allowed (n·p + 3·√(n·p·(1−p)), binomial at 3 sigma)",
			bots, len(ev.Bots), 100*p, res.BotUnits, sold, 100*float64(res.BotUnits)/float64(max(1, sold)), res.BotBound)
	}

	// Every abuse refused with its code.
	var parts []string
	bad = nil
	tried := 0
	for _, kind := range []string{AbuseNoProof, AbuseWrongProof, AbuseOthersProof, AbuseUsedCode, AbuseNoPass,
		AbuseForgedPass, AbuseOthersPass, AbuseSpentPass, AbuseExpiredPass} {
		codes := ev.Abuses[kind]
		if len(codes) == 0 {
			continue
		}
		var cs []string
		for _, code := range sortedCodes(codes) {
			tried += codes[code]
			cs = append(cs, fmt.Sprintf("%s %d", code, codes[code]))
			if code != abuseCode[kind] {
				bad = append(bad, fmt.Sprintf("%s: %s %d", kind, code, codes[code]))
			}
		}
		parts = append(parts, kind+": "+strings.Join(cs, ", "))
	}
	for kind := range ev.Abuses {
		if _, known := abuseCode[kind]; !known {
			bad = append(bad, "unknown abuse "+kind)
		}
	}
	res.Abuses, res.RepeatJoins, res.RepeatSame = ev.Abuses, ev.RepeatJoins, ev.RepeatSame
	add("every bot abuse refused with its typed code", len(bad) == 0 && tried > 0, "%d abuses; %s%s", tried, strings.Join(parts, "; "), sample(bad))
	return checks
}

// binomialBound is the most successes n draws of probability p give,
// within three standard deviations: n·p + 3·√(n·p·(1−p)). Units drawn from
// a fixed set of principals without replacement vary less than this
// (hypergeometric), so the bound is conservative.
func binomialBound(n int, p float64) float64 {
	mean := float64(n) * p
	return mean + 3*math.Sqrt(mean*(1-p))
}

// writeQueueText prints the queue rehearsal's figures.
func writeQueueText(b *strings.Builder, q *QueueResult) {
	fmt.Fprintf(b, "\nqueue rehearsal: SKU %s, %d units, %d servers; %d people (%d polling), %d bots x %d connections; proof of work %d bits, passes %d s, %d admitted/min, access codes %v\n",
		q.SKU, q.Stock, q.Servers, q.People, q.Pollers, q.Bots, q.BotConns, q.PowBits, q.PassSeconds, q.AdmitPerMinute, q.AccessCodes)
	fmt.Fprintf(b, "  joins: %d before the opening in %.2fs (ledger pre-queue %d), %d after; join p99 %.1f ms; %d tickets, admitted through %d\n",
		q.Early, q.EarlySeconds, q.PreQueue, q.Late, q.JoinP99ms, q.Tickets, q.AdmittedThrough)
	fmt.Fprintf(b, "  sold out %.2fs after the opening: people %d units, bots %d (bound %.1f); SOLD_OUT to %d of %d websocket waiters p50 %.0f ms, max %.0f ms after the last sale; load average %s\n",
		q.SellSeconds, q.PeopleUnits, q.BotUnits, q.BotBound, q.Told, q.Watching, q.SoldOutLate.P50ms, q.SoldOutLate.MaxMs, q.LoadAvg)
	for _, who := range []struct {
		name string
		m    map[string]int
	}{{"people", q.PeopleOutcomes}, {"bots", q.BotOutcomes}} {
		var parts []string
		for _, k := range sortedCodes(who.m) {
			parts = append(parts, fmt.Sprintf("%s %d", k, who.m[k]))
		}
		fmt.Fprintf(b, "  %-6s %s\n", who.name, strings.Join(parts, ", "))
	}
}
