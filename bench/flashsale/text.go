package flashsale

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText prints the human summary: the operations table, the buyers'
// outcomes and the verdict.
func WriteText(w io.Writer, r *Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Dropline flash sale  run %s  SKU %s  targets %s\n", r.RunID, r.SKU, strings.Join(r.Targets, ", "))
	fmt.Fprintf(&b, "%d buyers, concurrency %d, %d unit(s) each; stock before: available %d of %d; drop %.2fs, drain %.2fs\n\n",
		r.Buyers, r.Concurrency, r.Quantity, r.Initial.Available, r.Initial.Total, r.ElapsedSeconds, r.DrainSeconds)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\trequests\treq/s\tp50 ms\tp95 ms\tp99 ms\tmax ms\t")
	for _, o := range r.Ops {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", o.Op, o.Requests, o.PerSecond, o.P50ms, o.P95ms, o.P99ms, o.MaxMs)
	}
	_ = tw.Flush()
	b.WriteString("\noutcomes by code\n")
	for _, o := range r.Ops {
		var parts []string
		for _, c := range sortedCodes(o.Codes) {
			parts = append(parts, fmt.Sprintf("%s %d", c, o.Codes[c]))
		}
		fmt.Fprintf(&b, "  %-8s %s\n", o.Op, strings.Join(parts, ", "))
	}
	if q := r.QuietCommit; q != nil {
		fmt.Fprintf(&b, "\ncommit p99: quiet server %.1f ms (p50 %.1f, max %.1f; %s of %d commits one after the other on %s), during the storm %.1f ms (p50 %.1f, max %.1f; %s of %d commits): ÷ %.2f (goal <= 3); load average %s\n",
			q.Quiet.P99ms, q.Quiet.P50ms, q.Quiet.MaxMs, rankWord(q.QuietRank), q.Commits, q.SKU,
			q.Storm.P99ms, q.Storm.P50ms, q.Storm.MaxMs, rankWord(q.StormRank), q.StormCommits, q.Ratio, q.LoadAvg)
		if n := q.NoOp; n != nil {
			storm := "no answer"
			if n.StormN > 0 {
				storm = fmt.Sprintf("%.1f ms (p50 %.1f, max %.1f; %s of %d, one every %s)",
					n.Storm.P99ms, n.Storm.P50ms, n.Storm.MaxMs, rankWord(n.StormRank), n.StormN, noOpEvery)
			}
			fmt.Fprintf(&b, "no-op p99 (GET /healthz, the first server, from this process): quiet server %.1f ms (p50 %.1f, max %.1f; %s of %d one after the other; %d failed), during the storm %s; %d failed: ÷ %.2f, the floor under the commit's ÷ %.2f\n",
				n.Quiet.P99ms, n.Quiet.P50ms, n.Quiet.MaxMs, rankWord(n.QuietRank), n.QuietN, n.QuietFails, storm, n.StormFails, n.Ratio, q.Ratio)
		}
	}
	b.WriteString("\nbuyers\n")
	for _, k := range sortedCodes(r.BuyerOutcomes) {
		fmt.Fprintf(&b, "  %6d  %s\n", r.BuyerOutcomes[k], k)
	}

	if w := r.Watch; w != nil {
		fmt.Fprintf(&b, "\nlive watchers (%s): %d of %d connected in %.1fs, %d SKU(s), %d source addresses\n",
			w.Transport, w.Connected, w.Watchers, w.ConnectSeconds, w.SKUs, w.SourceAddrs)
		fmt.Fprintf(&b, "  changes          %d at %.0f/s (%d refused); load average %s\n", w.Changes, w.ChangeRate, w.ChangesFailed, w.LoadAvg)
		fmt.Fprintf(&b, "  change->watcher  p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms  (%d deliveries, %d missing)\n",
			w.Latency.P50ms, w.Latency.P90ms, w.Latency.P99ms, w.Latency.MaxMs, w.Deliveries, w.Missing)
		fmt.Fprintf(&b, "  change->all      p50 %.1f ms  p99 %.1f ms  max %.1f ms  (slowest watcher of each change)\n",
			w.ToAll.P50ms, w.ToAll.P99ms, w.ToAll.MaxMs)
		fmt.Fprintf(&b, "  change->first    p50 %.1f ms  p99 %.1f ms  max %.1f ms  (fastest watcher of each change)\n",
			w.ToFirst.P50ms, w.ToFirst.P99ms, w.ToFirst.MaxMs)
		fmt.Fprintf(&b, "  reserve          p50 %.1f ms  p99 %.1f ms  max %.1f ms  (each change's reserve, sent to answered)\n",
			w.Reserve.P50ms, w.Reserve.P99ms, w.Reserve.MaxMs)
		fmt.Fprintf(&b, "  reserve written  p50 %.1f ms  p99 %.1f ms  max %.1f ms  (until the driver wrote it)\n",
			w.ReserveWritten.P50ms, w.ReserveWritten.P99ms, w.ReserveWritten.MaxMs)
		fmt.Fprintf(&b, "  CPU per change   server %.1f ms, this driver %.1f ms; %d values received\n", w.ServerCPUPerChangeMs, w.DriverCPUPerChangeMs, w.Received)
		fmt.Fprintf(&b, "  converged        %d of %d after the drop (%.2fs), %d dropped\n", w.Converged, w.Connected, w.ConvergedSeconds, w.Dropped)
		fmt.Fprintf(&b, "  server memory    %.1f KiB RSS and %.1f goroutines per idle watcher (RSS %.1f -> %.1f MiB)\n",
			w.RSSPerWatcherKiB, w.GoroutinesPerConn, float64(w.RSSBeforeBytes)/(1<<20), float64(w.RSSIdleBytes)/(1<<20))
		if f := r.FloorWatch; f != nil {
			fmt.Fprintf(&b, "  floor            %d watchers of a bare broadcaster: change->all p50 %.1f ms  p99 %.1f ms  max %.1f ms; load average %s\n",
				f.Connected, f.ToAll.P50ms, f.ToAll.P99ms, f.ToAll.MaxMs, f.LoadAvg)
			fmt.Fprintf(&b, "  CPU per delivery server %.2f µs, floor %.2f µs: server ÷ floor %.2f (goal <= 1.5); change->all p99 %.1f ms (goal <= 250 ms)\n",
				f.ServerCPUPerDeliveryUs, f.CPUPerDeliveryUs, f.Ratio, w.ToAll.P99ms)
			fmt.Fprintf(&b, "  CPU per frame    server %.2f µs (%d frames read), floor %.2f µs (%d frames read): server ÷ floor %.2f\n",
				f.ServerCPUPerFrameUs, w.Received, f.CPUPerFrameUs, f.Received, f.FrameRatio)
		}
	}

	if w := r.Waitlist; w != nil {
		fmt.Fprintf(&b, "\nwaitlist rehearsal: SKU %s, %d units sold out, %d waiters queued, then %d cancels with %d outsiders reserving (%.2fs)\n",
			w.SKU, w.Holders, w.Waiters, w.Holders, w.Outsiders, w.CancelSeconds)
		fmt.Fprintf(&b, "  offered %d, still waiting %d, outsiders served %d; join p99 %.1f ms; stock available %d held %d\n",
			w.Offered, w.Waiting, w.OutsidersServed, w.JoinP99ms, w.Final.Available, w.Final.Held)
	}

	if d := r.Draw; d != nil {
		fmt.Fprintf(&b, "\ndraw rehearsal: SKU %s, %d units, %d entrants (%d entered twice) in %.2fs (%.0f entries/s), enter p99 %.1f ms\n",
			d.SKU, d.Stock, d.Entrants, d.Replays, d.EnterSeconds, d.EntriesPerSecond, d.EnterP99ms)
		writeEntryCost(&b, d)
		fmt.Fprintf(&b, "  applied %.2fs after closesAt (server's appliedAt; seen %.2fs); %d of %d watchers told by a push, median %.2fs, last %.2fs after closesAt\n",
			d.AppliedSeconds, d.AppliedSeenSeconds, d.Told, d.Watchers, d.PushP50Seconds, d.PushAllSeconds)
		for _, e := range d.WatchErrors {
			fmt.Fprintf(&b, "  watcher error: %s\n", e)
		}
		fmt.Fprintf(&b, "  drawn: %d entries, %d won (%d units), %d lost; every buyer saw the result %.2fs after closesAt; stock available %d held %d\n",
			d.Entries, d.Winners, d.WonUnits, d.Losers, d.DrawSeconds, d.Final.Available, d.Final.Held)
		if d.Verification != "" {
			fmt.Fprintf(&b, "  %s\n", d.Verification)
		}
	}

	if q := r.Queue; q != nil {
		writeQueueText(&b, q)
	}

	v := r.Verdict
	status := "PASS"
	if !v.OK {
		status = "FAIL"
	}
	fmt.Fprintf(&b, "\nVERDICT  %s\n", status)
	fmt.Fprintf(&b, "  units sold      %d (this run)\n", v.SoldUnits)
	fmt.Fprintf(&b, "  units held      %d\n", v.HeldUnits)
	fmt.Fprintf(&b, "  oversold        %d\n", v.Oversold)
	if r.Ledger != nil {
		fmt.Fprintf(&b, "  commits         clients saw %d (%d units), Postgres has %d (%d units), unknown outcome %d\n",
			v.CommitsSeen, v.UnitsSeen, v.CommitsInLedger, v.UnitsInLedger, v.CommitsUnknown)
		fmt.Fprintf(&b, "  availability    API %d, ledger %d\n", r.Final.Available, r.Ledger.Total-r.Ledger.Sold-r.Ledger.Held)
	} else {
		fmt.Fprintf(&b, "  commits         clients saw %d (%d units); Postgres not checked\n", v.CommitsSeen, v.UnitsSeen)
	}
	for _, c := range v.Checks {
		mark := "ok  "
		switch {
		case c.Skipped:
			mark = "skip"
		case !c.OK:
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "  [%s] %s: %s\n", mark, c.Name, c.Detail)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
