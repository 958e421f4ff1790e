package httpbench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Check is one goal of the run with its measured value. A retired goal is
// still measured and printed, for comparison with older runs, but not judged.
type Check struct {
	Name    string
	Value   string
	Goal    string
	Passed  bool
	Retired bool
}

// Checks compares the run with the goals Dropline sets itself
// (docs/design.md, section 5).
func (r Result) Checks() []Check {
	held := r.Reserve.PerSecond(r.Reserve.Held)
	pgP99 := r.Postgres.P99MS
	gqlP99 := ms(r.Reserve.P99US)
	storm := r.Storm.PerSecond(r.Storm.OutOfStock)
	return []Check{
		{Name: "GraphQL reserves ÷ raw EVALSHA", Value: fmt.Sprintf("%.2f", div(held, r.Redis.PerSecond)),
			Goal: "retired: the two floors below replace it", Retired: true},
		judged("GraphQL reserves ÷ PostgreSQL only", fmt.Sprintf("%.1f", div(held, r.Postgres.PerSecond)), ">= 10", div(held, r.Postgres.PerSecond) >= 10),
		judged("reserve p99 ÷ PostgreSQL p99", fmt.Sprintf("%.3f", div(gqlP99, pgP99)), "<= 0.1", div(gqlP99, pgP99) <= 0.1),
		judged("p99 ÷ p50 at 80 % of the maximum", fmt.Sprintf("%.1f", div(float64(r.Steady.P99US), float64(r.Steady.P50US))), "<= 4",
			r.Steady.P50US > 0 && r.Steady.P99US <= 4*r.Steady.P50US && r.Steady.PerSecond(r.Steady.Requests) >= 0.95*r.SteadyRate),
		judged("sold-out answers ÷ successful reserves", fmt.Sprintf("%.2f", div(storm, held)), ">= 3", div(storm, held) >= 3),
		judged("ledger apply capacity ÷ event rate (peak)", fmt.Sprintf("%.1f", div(r.Peak.Capacity, r.Peak.EventRate)), ">= 3", div(r.Peak.Capacity, r.Peak.EventRate) >= 3),
		judged("write-behind lag p99 (peak)", fmt.Sprintf("%.2f s", r.Peak.LagP99), "<= 1 s", r.Peak.Samples > 0 && r.Peak.LagP99 <= 1),
		judged("dropline CPU per hold ÷ floor server CPU per request", fmt.Sprintf("%.2f (%.1f ÷ %.1f µs)", div(float64(r.ServerCPU), float64(r.FloorCPU)), us(r.ServerCPU), us(r.FloorCPU)),
			"<= 1.5", r.FloorCPU > 0 && div(float64(r.ServerCPU), float64(r.FloorCPU)) <= 1.5),
		judged("redis-server CPU per hold ÷ per bare script call", fmt.Sprintf("%.2f (%.1f ÷ %.1f µs)", div(float64(r.RedisCPU), float64(r.RedisBareCPU)), us(r.RedisCPU), us(r.RedisBareCPU)),
			"<= 1.0", r.RedisBareCPU > 0 && div(float64(r.RedisCPU), float64(r.RedisBareCPU)) <= 1.0),
		judged("units the stock lost − holds wrk saw", fmt.Sprintf("%d", r.StockFell-r.Reserve.Held), fmt.Sprintf("0–%d (in flight)", r.Config.Connections),
			r.StockFell >= r.Reserve.Held && r.StockFell-r.Reserve.Held <= int64(r.Config.Connections)),
	}
}

// judged is a goal with its target, met or not.
func judged(name, value, goal string, passed bool) Check {
	return Check{Name: name, Value: value, Goal: goal, Passed: passed}
}

// holdCPU is the machine's whole CPU time per successful hold over the
// reserve step: dropline, redis-server, PostgreSQL's backends and wrk.
func (r Result) holdCPU() time.Duration {
	return r.ServerCPU + r.RedisCPU + r.PostgresCPU + r.LoadCPU
}

// bareLoadCPU is wrk's CPU time per request of the bare handler's run.
func (r Result) bareLoadCPU() time.Duration {
	if r.Bare.Requests == 0 {
		return 0
	}
	return r.Bare.CPU / time.Duration(r.Bare.Requests)
}

// StormCeiling is what storm answers ÷ successful holds would be, the
// machine's CPU being what both steps are bound by, if Dropline's sold-out
// answer cost no more than the bare net/http handler's: the whole CPU per
// hold ÷ the bare handler's, wrk's in its run and redis-server's per storm
// answer. 0 without a bare handler measured.
func (r Result) StormCeiling() float64 {
	if r.BareCPU == 0 {
		return 0
	}
	return div(float64(r.holdCPU()), float64(r.BareCPU+r.bareLoadCPU()+r.StormRedisCPU))
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Markdown renders the run as the section docs/benchmarks.md carries.
func (r Result) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "Last run: %s, load average at the start %s, steps of %s, peak of %s, %d connections.\n\n",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Load, c.Step, c.Peak, c.Connections)
	b.WriteString("| contender | ops/s | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n")
	row := func(name string, ops, p50, p99, maxMS float64) {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.1f |\n", name, thousands(ops), p50, p99, maxMS)
	}
	row(fmt.Sprintf("`reserve` over GraphQL HTTP, successful holds (%s buyers)", thousands(float64(c.Buyers))),
		r.Reserve.PerSecond(r.Reserve.Held), ms(r.Reserve.P50US), ms(r.Reserve.P99US), ms(r.Reserve.MaxUS))
	row("reserve-shaped script by EVALSHA, `redis-benchmark`", r.Redis.PerSecond, r.Redis.P50MS, r.Redis.P99MS, r.Redis.MaxMS)
	if r.FloorCPU > 0 {
		row("floor: net/http + gqlgen, `reserve` returns a fixed reservation", r.Floor.PerSecond(r.Floor.Requests), ms(r.Floor.P50US), ms(r.Floor.P99US), ms(r.Floor.MaxUS))
	}
	row("PostgreSQL only, `pgbench` (UPDATE + INSERT)", r.Postgres.PerSecond, r.Postgres.P50MS, r.Postgres.P99MS, r.Postgres.MaxMS)
	row(fmt.Sprintf("sold-out storm, `OUT_OF_STOCK` answers (%s buyers)", thousands(float64(c.StormBuyers))),
		r.Storm.PerSecond(r.Storm.OutOfStock), ms(r.Storm.P50US), ms(r.Storm.P99US), ms(r.Storm.MaxUS))
	if r.BareCPU > 0 {
		row("floor: bare `net/http` handler writing the sold-out answer", r.Bare.PerSecond(r.Bare.Requests), ms(r.Bare.P50US), ms(r.Bare.P99US), ms(r.Bare.MaxUS))
	}
	row(fmt.Sprintf("paced at %s/s (80 %% of the maximum)", thousands(r.SteadyRate)),
		r.Steady.PerSecond(r.Steady.Held), ms(r.Steady.P50US), ms(r.Steady.P99US), ms(r.Steady.MaxUS))
	row(fmt.Sprintf("sustained peak (%s)", c.Peak), r.Peak.EventRate, ms(r.Peak.Reserve.P50US), ms(r.Peak.Reserve.P99US), ms(r.Peak.Reserve.MaxUS))
	fmt.Fprintf(&b, "\nWrite-behind over the peak: %s events/s produced, %s/s applied, apply capacity %s/s "+
		"(events per second of flusher busy time; %.0f events a batch, busy %.0f %% of the time), PostgreSQL CPU %.1f µs per event; "+
		"lag p50 %.2f s, p99 %.2f s, max %.2f s (%d samples); backlog at most %s; drained %.1f s after the peak.\n\n",
		thousands(r.Peak.EventRate), thousands(r.Peak.AppliedRate), thousands(r.Peak.Capacity), r.Peak.BatchMean, 100*r.Peak.BusyShare, us(r.Peak.PostgresCPU),
		r.Peak.LagP50, r.Peak.LagP99, r.Peak.LagMax, r.Peak.Samples, thousands(r.Peak.BacklogMax), r.Peak.DrainSeconds)
	fmt.Fprintf(&b, "CPU time per successful reserve over the reserve step: dropline %.1f µs, redis-server %.1f µs, "+
		"PostgreSQL %.1f µs (the database's backends), wrk %.1f µs (the load generator); %.1f µs in all.\n\n",
		us(r.ServerCPU), us(r.RedisCPU), us(r.PostgresCPU), us(r.LoadCPU), us(r.holdCPU()))
	fmt.Fprintf(&b, "CPU time per answer over the sold-out storm: dropline %.1f µs, redis-server %.1f µs, wrk %.1f µs.\n\n",
		us(r.StormCPU), us(r.StormRedisCPU), us(r.StormLoadCPU))
	fmt.Fprintf(&b, "Floors, in the same run: the floor server used %.1f µs of CPU per request (dropline ÷ floor: %.2f); "+
		"redis-server used %.1f µs per call of the bare reserve-shaped script (per hold ÷ per bare call: %.2f).\n\n",
		us(r.FloorCPU), div(float64(r.ServerCPU), float64(r.FloorCPU)), us(r.RedisBareCPU), div(float64(r.RedisCPU), float64(r.RedisBareCPU)))
	if r.BareCPU > 0 {
		fmt.Fprintf(&b, "Driven by the storm's wrk script, the bare `net/http` handler (the sold-out answer's bytes and headers, nothing parsed) "+
			"used %.1f µs of CPU per request and wrk %.1f µs (dropline per storm answer ÷ bare handler: %.2f). "+
			"Were Dropline's answer to cost no more than the bare handler's, storm answers ÷ successful holds could reach %.2f with `net/http` "+
			"(%.1f µs in all per hold ÷ %.1f µs of handler, wrk and redis-server per answer).\n\n",
			us(r.BareCPU), us(r.bareLoadCPU()), div(float64(r.StormCPU), float64(r.BareCPU)), r.StormCeiling(),
			us(r.holdCPU()), us(r.BareCPU+r.bareLoadCPU()+r.StormRedisCPU))
	}
	fmt.Fprintf(&b, "Other answers: reserve run %d rate limited, %d other, %d failed; storm %d rate limited, %d other, %d failed; "+
		"paced run %d without a hold, %d failed.\n\n",
		r.Reserve.RateLimited, r.Reserve.Other+r.Reserve.OutOfStock, r.Reserve.Failed+r.Reserve.socketErrors(),
		r.Storm.RateLimited, r.Storm.Other+r.Storm.Held, r.Storm.Failed+r.Storm.socketErrors(),
		r.Steady.Requests-r.Steady.Held, r.Steady.Failed+r.Steady.socketErrors())
	b.WriteString("| goal | measured | target | |\n|---|---|---|---|\n")
	for _, ch := range r.Checks() {
		mark := "met"
		switch {
		case ch.Retired:
			mark = "—"
		case !ch.Passed:
			mark = "**not met**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", ch.Name, ch.Value, ch.Goal, mark)
	}
	return b.String()
}

// Text is the summary printed at the end of a run.
func (r Result) Text() string {
	var b strings.Builder
	b.WriteString(r.Markdown())
	return b.String()
}

func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// Section markers in docs/benchmarks.md: what lies between them is rewritten
// by every run.
const (
	BeginMarker = "<!-- bench-http:begin (written by make bench-http) -->"
	EndMarker   = "<!-- bench-http:end -->"
)

// RewriteSection replaces what lies between the markers in the file at path.
func RewriteSection(path, content string) error {
	old, err := os.ReadFile(path) //nolint:gosec // a documentation file named by the caller
	if err != nil {
		return err
	}
	i := bytes.Index(old, []byte(BeginMarker))
	j := bytes.Index(old, []byte(EndMarker))
	if i < 0 || j < i {
		return errors.New(path + " has no bench-http section markers")
	}
	var b bytes.Buffer
	b.Write(old[:i+len(BeginMarker)])
	b.WriteString("\n")
	b.WriteString(content)
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644) //nolint:gosec // documentation is world-readable
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
