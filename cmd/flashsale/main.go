// Command flashsale rehearses a drop against running Dropline servers over
// GraphQL HTTP, the way real frontends would, and then checks that nothing
// was oversold and every sale a buyer was told about is in Postgres.
//
// main only wires: flags and environment become a flashsale.Config, the
// drop runs in package bench/flashsale, and the verdict decides the exit
// status: 0 when every check passed, 1 when one failed, 2 when the drop
// could not be run (usage, unreachable target or ledger).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/dropline/dropline/bench/flashsale"
	"github.com/dropline/dropline/config"
)

const (
	exitOK        = 0
	exitViolation = 1
	exitUsage     = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// urlList is a repeatable, comma-separated --url flag.
type urlList struct {
	urls []string
	set  bool
}

func (u *urlList) String() string { return strings.Join(u.urls, ",") }
func (u *urlList) Set(v string) error {
	if !u.set {
		u.urls, u.set = nil, true
	}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			u.urls = append(u.urls, p)
		}
	}
	return nil
}

// run is main without the process: testable with its own arguments,
// environment and output.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg := flashsale.DefaultConfig()
	fs := flag.NewFlagSet("flashsale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	targets := urlList{urls: cfg.Targets}
	fs.Var(&targets, "url", "Dropline base URL(s), repeatable or comma separated; buyers are spread round-robin")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow targets that are not loopback addresses")
	dev := fs.Bool("dev", false, "sign tokens with the development secret (the server runs with DROPLINE_DEV=1 and no secret)")
	secret := fs.String("jwt-secret", "", "HS256 secret to mint tokens with (prefer the DROPLINE_JWT_SECRET environment variable)")
	fs.IntVar(&cfg.Buyers, "buyers", cfg.Buyers, "distinct buyers, one reserve each (max 200000)")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "buyers in flight at once")
	fs.StringVar(&cfg.SKU, "sku", "", "use this existing SKU instead of creating FLASH-<run>")
	fs.IntVar(&cfg.Stock, "stock", cfg.Stock, "units of the created SKU")
	fs.IntVar(&cfg.MaxPerUser, "max-per-user", cfg.MaxPerUser, "per-user limit of the created SKU (0: none)")
	fs.IntVar(&cfg.Quantity, "quantity", cfg.Quantity, "units each buyer reserves")
	fs.Float64Var(&cfg.CommitRatio, "commit", cfg.CommitRatio, "share of winning buyers who commit")
	fs.Float64Var(&cfg.CancelRatio, "cancel", cfg.CancelRatio, "share of winning buyers who cancel (the rest abandon)")
	fs.DurationVar(&cfg.Hold, "hold", cfg.Hold, "hold duration asked for (whole seconds)")
	fs.DurationVar(&cfg.Think, "think", cfg.Think, "longest pause between reserve and commit/cancel")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "stop starting buyers after this long")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per-request timeout")
	fs.IntVar(&cfg.Retries, "retries", cfg.Retries, "resends of a request whose outcome is unknown (same idempotency key or token)")
	dbDefault := getenv(config.EnvDatabaseURL)
	if dbDefault == "" {
		dbDefault = config.DefaultDatabaseURL
	}
	fs.StringVar(&cfg.DatabaseURL, "database-url", dbDefault, "Postgres ledger the verdict reads ($DATABASE_URL when set)")
	fs.StringVar(&cfg.RedisURL, "redis-url", getenv(config.EnvRedisURL), "the servers' Redis, whose CPU the draw rehearsal reads for its CPU per entry ($REDIS_URL when set; empty: not read)")
	noLedger := fs.Bool("no-ledger", false, "skip the ledger checks (the verdict then rests on the API alone)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "how long to wait for the write-behind to drain")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the buyers' choices")
	fs.IntVar(&cfg.Waiters, "waitlist", 0, "after the drop, rehearse the waitlist: sell --stock units out, queue this many waiters, cancel every hold while outsiders reserve (0: none; max 10000)")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "drop (the drop alone), draw (the drop, then a draw rehearsal: --entrants buyers enter a draw of --stock units, the server draws, the verdict checks and recomputes it) or queue (the drop, then a queued drop of --stock units: --queue-people people and --queue-bots bots against every --url)")
	fs.IntVar(&cfg.Entrants, "entrants", cfg.Entrants, "buyers entering the draw rehearsal, every tenth twice (--mode draw; max 100000)")
	fs.IntVar(&cfg.DrawWatchers, "draw-watchers", cfg.DrawWatchers, "entrants (spread over them) that watch their entry with myDrawEntryChanged over a websocket each, to time the push of the result (--mode draw; max 20000)")
	fs.DurationVar(&cfg.DrawWindow, "draw-window", cfg.DrawWindow, "how long the rehearsal's draw takes entries before it is drawn (--mode draw)")
	fs.IntVar(&cfg.QueuePeople, "queue-people", cfg.QueuePeople, fmt.Sprintf("people joining the queue rehearsal once each (--mode queue; max %d)", flashsale.MaxQueuePeople))
	fs.IntVar(&cfg.QueueBots, "queue-bots", cfg.QueueBots, "bot principals of the queue rehearsal, each joining over many connections and trying every abuse (--mode queue)")
	fs.IntVar(&cfg.QueueBotConns, "queue-bot-conns", cfg.QueueBotConns, fmt.Sprintf("connections (subscriptions and simultaneous joins) per bot (--mode queue; max %d)", flashsale.MaxQueueBotConns))
	fs.Float64Var(&cfg.QueuePollers, "queue-pollers", cfg.QueuePollers, "share of the people who poll myQueueTicket instead of subscribing to queueChanged (--mode queue)")
	fs.Float64Var(&cfg.QueueEarly, "queue-early", cfg.QueueEarly, "share of the principals who join the pre-queue before the opening (--mode queue)")
	fs.DurationVar(&cfg.QueueWindow, "queue-window", cfg.QueueWindow, "from the queue's creation to its opening: the pre-queue joins must fit (--mode queue)")
	fs.IntVar(&cfg.QueueAdmitPerMinute, "admit-per-minute", cfg.QueueAdmitPerMinute, "the queue's admitPerMinute (--mode queue)")
	fs.IntVar(&cfg.QueuePassSeconds, "pass-seconds", cfg.QueuePassSeconds, "the queue's passSeconds, 10-120; the first bot admitted keeps its pass that long (--mode queue)")
	fs.IntVar(&cfg.QueuePowBits, "pow-bits", cfg.QueuePowBits, "the queue's proofOfWorkBits, 0-20 (--mode queue)")
	fs.BoolVar(&cfg.QueueAccessCodes, "access-codes", false, "give the queue one presale access code per principal; bots try used ones (--mode queue)")
	fs.IntVar(&cfg.Watchers, "watchers", 0, "live stockChanged subscribers watching the drop, one connection each (0: none; max 50000)")
	fs.StringVar(&cfg.WatchTransport, "watch-transport", cfg.WatchTransport, "watchers' transport: ws (graphql-transport-ws) or sse")
	fs.IntVar(&cfg.WatchSKUs, "watch-skus", cfg.WatchSKUs, "SKUs the watchers spread over: 1 is the drop's hot SKU, more creates SKUs besides it")
	fs.IntVar(&cfg.Changes, "changes", cfg.Changes, "measured changes made before the drop, one unit reserved each")
	fs.Float64Var(&cfg.ChangeRate, "change-rate", cfg.ChangeRate, "measured changes per second")
	fs.IntVar(&cfg.SourceAddrs, "source-addrs", 0, "loopback source addresses (127.0.0.2 up) the watchers spread over (0: one per 200 watchers)")
	fs.DurationVar(&cfg.ConvergeTimeout, "converge-timeout", cfg.ConvergeTimeout, "how long every watcher may take to reach the last change and the final stock")
	fs.IntVar(&cfg.QuietCommits, "quiet-commits", cfg.QuietCommits, "reserve-and-commit pairs timed one after the other before the buyers, on a SKU of their own: the commit p99 on a quiet server the storm's is divided by (nearest rank: below 100 it is their slowest; 0: none); as many no-op requests (GET /healthz) are timed after them, and one every 10ms through the storm, the floor beside it")
	fs.StringVar(&cfg.FloorURL, "floor-url", "", "a fan-out floor (bench-floor ws) measured like the server's websocket watchers, for CPU per delivery ÷ the floor's")
	fs.DurationVar(&cfg.WatchP99, "watch-p99", cfg.WatchP99, "change-to-watcher p99 the verdict requires (0: not checked)")
	fs.Float64Var(&cfg.WatchRSSKiB, "watch-rss-kib", cfg.WatchRSSKiB, "server RSS per idle watcher the verdict allows, in KiB (0: not checked)")
	report := fs.String("report", "", "write a self-contained HTML report to this file")
	asJSON := fs.Bool("json", false, "print the result as JSON instead of the table")
	quiet := fs.Bool("quiet", false, "no progress bar")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "flashsale: rehearse a flash sale against running Dropline servers and check the verdict\n\n"+
			"Usage: flashsale --url URL [flags]   (`make flashsale` runs it against a server of its own)\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "flashsale: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	cfg.Targets = targets.urls
	switch {
	case *secret != "":
		cfg.Secret = []byte(*secret)
	case getenv(config.EnvJWTSecret) != "":
		cfg.Secret = []byte(getenv(config.EnvJWTSecret))
	default:
		// What `make run` serves: a dev server accepts the public dev secret.
		if !*dev {
			fmt.Fprintf(stderr, "flashsale: %s is not set; signing with the development secret, accepted only by a server with DROPLINE_DEV=1\n", config.EnvJWTSecret)
		}
		cfg.Secret = []byte(config.DevJWTSecret)
	}
	if *noLedger {
		cfg.DatabaseURL = ""
	}
	if !*quiet {
		cfg.Progress = &flashsale.Bar{W: stderr, Terminal: isTerminal(stderr)}
		cfg.Status = func(line string) { fmt.Fprintf(stderr, "flashsale: %s\n", line) }
	}
	need := uint64(cfg.Watchers)
	if cfg.Mode == flashsale.ModeQueue {
		need += uint64(cfg.QueuePeople + cfg.QueueBots*cfg.QueueBotConns*2)
	}
	if need > 0 {
		if err := raiseFileLimit(need + uint64(cfg.Concurrency) + 256); err != nil {
			fmt.Fprintf(stderr, "flashsale: %v\n", err)
			return exitUsage
		}
	}

	d, err := flashsale.NewDriver(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "flashsale: %v\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return exitUsage
	}
	defer d.Close()
	res, err := d.Run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "flashsale: %v\n", err)
		return exitUsage
	}
	if *report != "" {
		if err := writeReport(*report, res); err != nil {
			fmt.Fprintf(stderr, "flashsale: writing the report: %v\n", err)
			return exitUsage
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return exitUsage
		}
	} else if err := flashsale.WriteText(stdout, res); err != nil {
		return exitUsage
	}
	if *report != "" && !*asJSON {
		fmt.Fprintf(stdout, "\nreport: %s\n", *report)
	}
	if !res.Verdict.OK {
		return exitViolation
	}
	return exitOK
}

func writeReport(path string, res *flashsale.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := flashsale.WriteHTML(f, res); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// isTerminal reports whether w is a character device, so the bar can
// redraw in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// raiseFileLimit lifts the soft limit on open files to the hard limit when
// the watchers need more than the soft one allows (each watcher is a
// connection). A hard limit below need is an error naming the fix.
func raiseFileLimit(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading the open-files limit: %w", err)
	}
	if lim.Cur >= need {
		return nil
	}
	if lim.Max < need {
		return fmt.Errorf("the watchers need %d open files but the hard limit is %d: raise it (ulimit -Hn, or LimitNOFILE) or use fewer --watchers", need, lim.Max)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raising the open-files limit to %d: %w", lim.Max, err)
	}
	return nil
}
