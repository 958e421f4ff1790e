// Command bench-queue measures the admission queue black-box against the
// real binary (see httpbench.RunQueue): `make bench-queue` builds
// bin/dropline and runs it. It prints the figures docs/benchmarks.md quotes
// and the goals next to them. Exit status: 0 when it ran (whether or not
// every goal was met), 1 when it could not run, 2 on a bad command line.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dropline/dropline/bench/httpbench"
)

func main() {
	fs := flag.NewFlagSet("bench-queue", flag.ContinueOnError)
	cfg := httpbench.QueueConfig{Progress: os.Stderr}
	fs.StringVar(&cfg.Binary, "bin", "bin/dropline", "the dropline binary to start")
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "a loopback PostgreSQL server; the run creates and drops its own database there (default: DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres)")
	fs.IntVar(&cfg.Tickets, "tickets", 50_000, "principals joining the queue, each once")
	fs.IntVar(&cfg.Connections, "connections", 50, "wrk's connections for the joins and the polls")
	fs.DurationVar(&cfg.Step, "step", 10*time.Second, "length of each polling step and of the waiters' measurement")
	fs.IntVar(&cfg.Waiters, "waiters", 10_000, "websocket clients watching queueChanged (0: none)")
	fs.Func("server-env", "KEY=VALUE added to the server's environment (repeatable)", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("%q is not KEY=VALUE", v)
		}
		cfg.Env = append(cfg.Env, v)
		return nil
	})
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if cfg.Tickets < 1 || cfg.Connections < 1 || cfg.Step < time.Second || cfg.Waiters < 0 {
		fmt.Fprintln(os.Stderr, "bench-queue: --tickets and --connections at least 1, --step at least 1s, --waiters at least 0")
		os.Exit(2)
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := httpbench.RunQueue(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-queue: %v\n", err)
		stop()
		os.Exit(1) //nolint:gocritic // the deferred stop has run
	}
	report(os.Stdout, res)
}

func report(w io.Writer, r httpbench.QueueResult) {
	goal := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT MET"
	}
	fmt.Fprintf(w, "bench-queue %s, load average %s before, %s after\n", r.Started.Format(time.RFC3339), r.Load, r.LoadAfter)
	j := r.Joins
	fmt.Fprintf(w, "joins:          %d principals, %d joined in %.2f s: %.0f joins/s (goal >= 5000: %s); p50 %.1f ms p99 %.1f ms; %d other, %d failed; server %.0f µs CPU/join, redis %.0f µs\n",
		r.Config.Tickets, r.Joined, j.Seconds(), r.JoinRate, goal(r.JoinRate >= 5000), float64(j.P50US)/1000, float64(j.P99US)/1000,
		j.Other, j.Failed+j.ErrorsStatus, float64(r.JoinServerCPU.Microseconds()), float64(r.JoinRedisCPU.Microseconds()))
	fmt.Fprintf(w, "redis/ticket:   %.0f B (MEMORY USAGE of the queue's keys over %d tickets); used_memory grew %.0f B per ticket\n",
		r.RedisBytesPerTicket, r.Joined, r.UsedMemoryPerTicket)
	longest := fmt.Sprintf("none slower than %s", r.SlowlogFloor)
	if r.LongestScript > 0 {
		longest = fmt.Sprintf("%.2f ms (%s)", float64(r.LongestScript.Microseconds())/1000, r.LongestScriptName)
	}
	longestQ := fmt.Sprintf("none slower than %s", r.SlowlogFloor)
	if r.LongestQueueScript > 0 {
		longestQ = fmt.Sprintf("%.2f ms (%s)", float64(r.LongestQueueScript.Microseconds())/1000, r.LongestQueueScriptName)
	}
	fmt.Fprintf(w, "longest script: the queue's %s (goal <= 10 ms: %s); any script %s, over the whole run\n",
		longestQ, goal(r.LongestQueueScript <= 10*time.Millisecond), longest)
	pt, ps := r.PollTicket, r.PollStock
	fmt.Fprintf(w, "myQueueTicket:  %.0f/s p50 %.2f ms p99 %.2f ms (%d waiting, %d other, %d failed), server %.0f µs CPU each\n",
		pt.PerSecond(pt.Requests), float64(pt.P50US)/1000, float64(pt.P99US)/1000, pt.Held, pt.Other, pt.Failed, float64(r.PollTicketServerCPU.Microseconds()))
	fmt.Fprintf(w, "stock query:    %.0f/s p50 %.2f ms p99 %.2f ms (%d answered, %d other, %d failed), server %.0f µs CPU each\n",
		ps.PerSecond(ps.Requests), float64(ps.P50US)/1000, float64(ps.P99US)/1000, ps.Held, ps.Other, ps.Failed, float64(r.PollStockServerCPU.Microseconds()))
	fmt.Fprintf(w, "poll ratio:     myQueueTicket / stock query = %.2fx (goal >= 2: %s)\n", r.Ratio(), goal(r.Ratio() >= 2))
	if wr := r.Waiter; wr.Waiters > 0 {
		fmt.Fprintf(w, "waiters:        %d websocket waiters of queueChanged: server RSS %.1f MiB -> %.1f MiB, %.1f KiB per waiter (goal <= 32 KiB: %s)\n",
			wr.Connected, float64(wr.RSSBefore)/(1<<20), float64(wr.RSSIdle)/(1<<20), wr.RSSPerWaiter/1024, goal(wr.RSSPerWaiter <= 32<<10))
		fmt.Fprintf(w, "admitted:       admittedThrough moved by %d in Redis over the measurement; %d waiters' streams ended early\n",
			wr.AdmittedMeanwhile, len(wr.Errors))
		fmt.Fprintf(w, "steps:          %d admission steps over %.0f s, %d deliveries, %d missing: from the announcement p50 %.1f ms p99 %.1f ms max %.1f ms; to all waiters p99 %.1f ms (goal <= 1000 ms: %s); server %.1f ms CPU per step, this bench's clients %.1f ms\n",
			wr.Steps, wr.Measured.Seconds(), wr.Deliveries, wr.Missing, wr.Latency.P50, wr.Latency.P99, wr.Latency.Max, wr.ToAll.P99,
			goal(wr.Steps > 0 && wr.Missing == 0 && wr.ToAll.P99 <= 1000), float64(wr.ServerCPUPerStep.Microseconds())/1000,
			float64(wr.BenchCPUPerStep.Microseconds())/1000)
	}
}
