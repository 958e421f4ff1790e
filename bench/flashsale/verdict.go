package flashsale

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Observed is what the buyers saw during the drop: the only evidence a
// client has, which the verdict holds against the ledger.
type Observed struct {
	// Committed maps every token whose commit the client saw succeed to its
	// quantity.
	Committed map[string]int
	// Unknown maps tokens whose commit never got a definite answer (every
	// attempt timed out or failed in transit) to their quantity: they may or
	// may not have been sold, and either is correct.
	Unknown map[string]int
	// Samples are the stock readings taken during the drop.
	Samples []StockSample
}

// LedgerState is the Postgres ledger of one SKU.
type LedgerState struct {
	// Total and Sold are the products row.
	Total int `json:"total"`
	Sold  int `json:"sold"`
	// Held is the sum of quantities of reservations in status HELD.
	Held int `json:"held"`
	// SalesUnits is the sum of quantities of sales rows.
	SalesUnits int `json:"salesUnits"`
	// Sales maps the tokens of the sales made during this run (rows not in
	// the baseline) to their quantity.
	Sales map[string]int `json:"-"`
}

// VerdictInput is everything Judge needs. Ledger is nil when the ledger was
// not read (--no-ledger); its checks are then reported as skipped.
type VerdictInput struct {
	Observed Observed
	// API is the final stock the API reported once the ledger settled.
	API Stock
	// Ledger is the ledger once settled; Baseline its state before the drop
	// (zero for a SKU the drop created).
	Ledger   *LedgerState
	Baseline LedgerState
	// Settled is false when the ledger never stopped changing or never
	// agreed with the API within the drain timeout.
	Settled bool
}

// Check is one line of the verdict.
type Check struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail"`
}

// Verdict is the outcome of a drop: the headline figures and every check.
// OK is false as soon as one check that ran failed.
type Verdict struct {
	SoldUnits       int     `json:"soldUnits"`
	HeldUnits       int     `json:"heldUnits"`
	Oversold        int     `json:"oversold"`
	CommitsSeen     int     `json:"commitsSeen"`
	UnitsSeen       int     `json:"unitsSeen"`
	CommitsUnknown  int     `json:"commitsUnknown"`
	CommitsInLedger int     `json:"commitsInLedger"`
	UnitsInLedger   int     `json:"unitsInLedger"`
	Checks          []Check `json:"checks"`
	OK              bool    `json:"ok"`
}

// Failed lists the checks that ran and failed.
func (v Verdict) Failed() []Check {
	var out []Check
	for _, c := range v.Checks {
		if !c.OK && !c.Skipped {
			out = append(out, c)
		}
	}
	return out
}

// Judge decides whether the drop kept Dropline's promises (G1, G2 and G6 in
// docs/design.md): nothing oversold at any sampled moment nor in the ledger, every sale
// a client was told about is in Postgres and no sale exists that no client
// was told about (unless its answer was lost), and the live counters agree
// with the ledger once the write-behind has drained. It is pure, so a
// deliberately inconsistent ledger can be fed to it in a unit test.
func Judge(in VerdictInput) Verdict {
	var v Verdict
	add := func(name string, ok bool, format string, args ...any) {
		v.Checks = append(v.Checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	skip := func(name, why string) {
		v.Checks = append(v.Checks, Check{Name: name, OK: true, Skipped: true, Detail: why})
	}

	for _, q := range in.Observed.Committed {
		v.CommitsSeen++
		v.UnitsSeen += q
	}
	v.CommitsUnknown = len(in.Observed.Unknown)

	// G1 as the API showed it, at every sampled moment and at the end.
	worst, worstAt, broken := 0, 0.0, 0
	for _, s := range in.Observed.Samples {
		if over := s.Held + s.Sold - s.Total; over > worst {
			worst, worstAt = over, s.T
		}
		if s.Available+s.Held+s.Sold != s.Total || s.Available < 0 {
			broken++
		}
	}
	add("no oversell in live stock during the drop", worst == 0,
		"%d samples; worst held+sold-total = %d (at %.2fs)", len(in.Observed.Samples), worst, worstAt)
	apiOver := max(0, in.API.Held+in.API.Sold-in.API.Total)
	add("no oversell in final live stock", apiOver == 0,
		"API: available %d, held %d, sold %d, total %d", in.API.Available, in.API.Held, in.API.Sold, in.API.Total)
	add("live counters add up", broken == 0 && in.API.Available >= 0 &&
		in.API.Available+in.API.Held+in.API.Sold == in.API.Total,
		"available+held+sold == total in the final reading and in %d of %d samples",
		len(in.Observed.Samples)-broken, len(in.Observed.Samples))
	v.Oversold = apiOver
	v.SoldUnits = in.API.Sold - in.Baseline.Sold
	v.HeldUnits = in.API.Held

	const noLedger = "ledger not read (--no-ledger)"
	if in.Ledger == nil {
		for _, name := range []string{"no oversell in the ledger", "ledger sold matches its sales rows",
			"every confirmed commit is a sale in Postgres", "every sale was confirmed to a buyer",
			"live stock matches the ledger"} {
			skip(name, noLedger)
		}
		v.OK = len(v.Failed()) == 0
		return v
	}
	l := *in.Ledger
	v.SoldUnits = l.Sold - in.Baseline.Sold
	v.HeldUnits = l.Held
	ledgerOver := max(0, l.Sold+l.Held-l.Total)
	v.Oversold = max(v.Oversold, ledgerOver)
	add("no oversell in the ledger", ledgerOver == 0 && l.Sold <= l.Total,
		"sold %d + held %d <= total %d", l.Sold, l.Held, l.Total)
	add("ledger sold matches its sales rows", l.Sold == l.SalesUnits,
		"products.sold %d, sum of sales %d", l.Sold, l.SalesUnits)

	for _, q := range l.Sales {
		v.CommitsInLedger++
		v.UnitsInLedger += q
	}
	var missing, wrongQty, unannounced []string
	for tok, q := range in.Observed.Committed {
		lq, ok := l.Sales[tok]
		switch {
		case !ok:
			missing = append(missing, tok)
		case lq != q:
			wrongQty = append(wrongQty, fmt.Sprintf("%s (client %d, ledger %d)", tok, q, lq))
		}
	}
	lost := 0
	for tok := range l.Sales {
		if _, ok := in.Observed.Committed[tok]; ok {
			continue
		}
		if _, ok := in.Observed.Unknown[tok]; ok {
			lost++
			continue
		}
		unannounced = append(unannounced, tok)
	}
	add("every confirmed commit is a sale in Postgres", len(missing) == 0 && len(wrongQty) == 0,
		"clients saw %d commits (%d units); Postgres has %d sales (%d units) from this run; missing %d%s%s",
		v.CommitsSeen, v.UnitsSeen, v.CommitsInLedger, v.UnitsInLedger, len(missing), sample(missing), sample(wrongQty))
	add("every sale was confirmed to a buyer", len(unannounced) == 0,
		"%d sales no buyer was told about%s; %d with a lost answer (allowed)", len(unannounced), sample(unannounced), lost)

	agree := in.API.Total == l.Total && in.API.Sold == l.Sold && in.API.Held == l.Held &&
		in.API.Available == l.Total-l.Sold-l.Held
	detail := fmt.Sprintf("API available %d held %d sold %d total %d; ledger available %d held %d sold %d total %d",
		in.API.Available, in.API.Held, in.API.Sold, in.API.Total, l.Total-l.Sold-l.Held, l.Held, l.Sold, l.Total)
	if !in.Settled {
		detail += "; the ledger did not settle before the drain timeout"
	}
	add("live stock matches the ledger", agree && in.Settled, "%s", detail)

	v.OK = len(v.Failed()) == 0
	return v
}

// sample shows the first few items of a list of offenders.
func sample(items []string) string {
	if len(items) == 0 {
		return ""
	}
	sort.Strings(items)
	if len(items) > 3 {
		return " (" + strings.Join(items[:3], ", ") + ", ...)"
	}
	return " (" + strings.Join(items, ", ") + ")"
}

// JudgeWatch checks what the live watchers saw: every watcher connected and
// converged to the final stock (G8: never stale at rest), every measured
// change reached every watcher, and, when bounds are given, the delivery
// p99 and the server memory per idle watcher.
func JudgeWatch(w WatchResult, p99 time.Duration, rssKiB float64) []Check {
	var out []Check
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("every watcher subscribed", w.Failed == 0 && w.Connected == w.Watchers,
		"%d of %d %s watchers got their first value in %.1fs%s", w.Connected, w.Watchers, w.Transport, w.ConnectSeconds, sample(w.Errors))
	add("every watcher converged to the final stock", w.Converged == w.Connected && w.Connected > 0,
		"%d of %d converged (%.2fs after the final reading), %d dropped by the server", w.Converged, w.Connected, w.ConvergedSeconds, w.Dropped)
	add("every change reached every watcher", w.Missing == 0 && w.ChangesFailed == 0 && w.Deliveries > 0,
		"%d deliveries of %d changes (%d refused), %d missing", w.Deliveries, w.Changes, w.ChangesFailed, w.Missing)
	if p99 > 0 {
		add(fmt.Sprintf("change-to-watcher p99 within %s", p99), w.Deliveries > 0 && w.Latency.P99ms <= ms(p99),
			"p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms; slowest watcher per change p99 %.1f ms; load average %s",
			w.Latency.P50ms, w.Latency.P90ms, w.Latency.P99ms, w.Latency.MaxMs, w.ToAll.P99ms, w.LoadAvg)
	}
	if rssKiB > 0 {
		ok := w.RSSBeforeBytes > 0 && w.RSSPerWatcherKiB <= rssKiB
		detail := fmt.Sprintf("%.1f KiB per idle watcher (server RSS %.1f MiB before, %.1f MiB with the watchers), %.1f goroutines each",
			w.RSSPerWatcherKiB, float64(w.RSSBeforeBytes)/(1<<20), float64(w.RSSIdleBytes)/(1<<20), w.GoroutinesPerConn)
		if w.RSSBeforeBytes == 0 {
			detail = "the servers' /metrics did not report process_resident_memory_bytes"
		}
		add(fmt.Sprintf("server memory per idle watcher within %.0f KiB", rssKiB), ok, "%s", detail)
	}
	return out
}
