// Command bench-http measures the reserve hot path black-box (see
// bench/httpbench): `make bench-http` builds bin/dropline and runs it.
// It prints the figures and the goals, and with --doc rewrites the marked
// section of docs/benchmarks.md. Exit status: 0 when it ran (whether or
// not every goal was met), 1 when it could not run, 2 on a bad command line.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dropline/dropline/bench/httpbench"
)

func main() {
	fs := flag.NewFlagSet("bench-http", flag.ContinueOnError)
	bin := fs.String("bin", "bin/dropline", "the dropline binary to start")
	floorBin := fs.String("floor", "", "the bench-floor binary (cmd/bench-floor): its HTTP floor is measured beside the reserve step, its bare net/http handler beside the storm")
	dbURL := fs.String("database-url", "", "a loopback PostgreSQL server; the run creates and drops its own database there (default: DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres)")
	step := fs.Duration("step", 10*time.Second, "length of each measured step")
	peak := fs.Duration("peak", 60*time.Second, "length of the sustained peak the write-behind is watched over")
	conns := fs.Int("connections", 50, "concurrency of wrk and of the baselines")
	buyers := fs.Int("buyers", 3000, "distinct buyers rotating through the successful reserves")
	profile := fs.String("profile", "", "write a CPU profile of the server over the reserve step to this file (go tool pprof -top FILE)")
	reserveAndStorm := fs.Bool("reserve-storm", false, "run the reserve step and the sold-out storm only, printing the storm's ratio (to compare builds on it)")
	reserveOnly := fs.Bool("reserve-only", false, "stop after the GraphQL reserve step and the bare script's (to compare builds; read their CPU per operation)")
	var serverEnv []string
	fs.Func("server-env", "KEY=VALUE added to the server's environment (repeatable), e.g. DROPLINE_MUTATION_RATE=-1", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("%q is not KEY=VALUE", v)
		}
		serverEnv = append(serverEnv, v)
		return nil
	})
	traces := fs.Bool("traces", false, "turn the server's tracing on, exporting every span over OTLP/HTTP to a receiver on loopback that decodes and counts them (to measure what tracing costs)")
	doc := fs.String("doc", "", "rewrite the bench-http section of this file (docs/benchmarks.md)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *step < time.Second || *peak < time.Second || *conns < 1 || *buyers < 1 {
		fmt.Fprintln(os.Stderr, "bench-http: --step and --peak must be at least 1s, --connections and --buyers at least 1")
		os.Exit(2)
	}
	url := *dbURL
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	var sink *otlpSink
	if *traces {
		var err error
		if sink, err = startOTLPSink(); err != nil {
			fmt.Fprintf(os.Stderr, "bench-http: starting the OTLP receiver: %v\n", err)
			os.Exit(1)
		}
		defer sink.Close()
		serverEnv = append(serverEnv, "OTEL_EXPORTER_OTLP_ENDPOINT="+sink.URL)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := httpbench.Run(ctx, httpbench.Config{
		Binary: *bin, DatabaseURL: url, Step: *step, Peak: *peak, Connections: *conns, Buyers: *buyers,
		Env: serverEnv, Profile: *profile, Floor: *floorBin, ReserveOnly: *reserveOnly, ReserveAndStorm: *reserveAndStorm, Progress: os.Stderr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-http: %v\n", err)
		stop()
		os.Exit(1) //nolint:gocritic // the deferred stop has run
	}
	if sink != nil {
		fmt.Fprintf(os.Stderr, "bench-http: traces: %d spans received in %d OTLP exports\n", sink.spans.Load(), sink.exports.Load())
	}
	if *reserveOnly || *reserveAndStorm {
		return
	}
	fmt.Print(res.Text())
	if *doc != "" {
		if err := httpbench.RewriteSection(*doc, res.Markdown()); err != nil {
			fmt.Fprintf(os.Stderr, "bench-http: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "bench-http: wrote %s\n", *doc)
	}
}
