// Command dropline is the one Dropline binary: the server, its migrations,
// the demo seed, a token minter and a draw verifier, as subcommands.
//
// main only wires: it loads and validates the configuration from the
// environment, builds an app.App and runs the subcommand. Start-up failures
// print one line to stderr and exit 1; usage errors exit 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/app"
	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `dropline: GraphQL storefront backend for flash sales

Usage:
  dropline serve                      run the HTTP server and the worker group
  dropline migrate                    apply pending PostgreSQL migrations
  dropline seed --demo                create the demo catalogue (idempotent)
  dropline token --user ID [--admin] [--ttl 24h]
                                      print a signed bearer token
  dropline verify-draw --sku S        recompute a drawn SKU's winners from its seed and entries
  dropline verify-queue --sku S|--drop D  recompute a queue's pre-queue order from its seed
                                      (DATABASE_URL) and check them against the recorded result
  dropline version                    print the version
  dropline help                       show this help

Configuration comes from the environment (defaults in parentheses):
  REDIS_URL                  (redis://127.0.0.1:6379/0; redis-cluster://h1:p1,h2:p2 for a cluster)
  REDIS_CLUSTER_ADDRS        cluster seed nodes host:port,... (empty)
  DATABASE_URL               (postgres://postgres@127.0.0.1:5432/dropline?sslmode=disable)
  DROPLINE_ADDR              (:8080; 127.0.0.1:8080 in dev mode)
  DROPLINE_JWT_SECRET        HS256 secret, at least 32 bytes (required unless DROPLINE_DEV=1)
  DROPLINE_JWT_ISSUER        "iss" every token must carry; token writes it (any)
  DROPLINE_JWT_AUDIENCE      "aud" every token must include; token writes it (none)
  DROPLINE_JWT_MAX_LIFETIME  refuse tokens valid for longer; 0 = no limit (24h)
  DROPLINE_DEV               1 = development mode: built-in secret, introspection, loopback only, /dev/token (off)
  DROPLINE_DEV_ALLOW_REMOTE  1 = dev mode may listen on a non-loopback address (off)
  DROPLINE_KEY_PREFIX        (dl:)
  DROPLINE_HOLD_DEFAULT      (600s)
  DROPLINE_HOLD_MAX          (3600s)
  DROPLINE_HOLD_EXTENSIONS   times the holder may extend a hold, 0-100 (2)
  DROPLINE_WAITLIST_MAX      most waiters on one SKU, 1-100000 (10000)
  DROPLINE_CORS_ORIGINS      comma separated origins (same-origin only)
  DROPLINE_LEASE_TTL         worker lease per partition (10s)
  DROPLINE_REJECTION_TTL     how long a refused reserve replays for its idempotency key (5m)
  DROPLINE_MUTATION_RATE     mutations per second per principal; negative = no limit (10)
  DROPLINE_MUTATION_BURST    mutations one principal may send at once, a cart's lines each count, at least 50 (50)
  DROPLINE_COST_LIMIT        most one operation may cost (2000)
  DROPLINE_COST_RATE         cost points per second per caller's budget, per instance; negative = no budgets (1000)
  DROPLINE_COST_BURST        most points a budget holds, at least DROPLINE_COST_LIMIT (10000)
  DROPLINE_RESPONSE_MAX_BYTES  largest response, 1024-67108864 (1048576)
  DROPLINE_REDIS_WAIT_REPLICAS  replicas each reserve and commit waits for (0)
  DROPLINE_REDIS_WAIT_TIMEOUT   longest such wait, 1ms-1s (50ms)
  DROPLINE_TRUSTED_PROXIES   comma separated CIDRs or addresses of the load balancers (none)
  DROPLINE_CLIENT_ADDR_HEADER  x-forwarded-for|forwarded, read from trusted proxies (x-forwarded-for)
  DROPLINE_STREAM_CONNS_PER_IP         websocket and SSE connections per client address (256)
  DROPLINE_STREAM_CONNS_PER_PRINCIPAL  stream connections per principal (32)
  DROPLINE_STREAM_SUBS_PER_CONN        subscriptions per websocket (32)
  DROPLINE_STREAM_MESSAGE_BYTES        largest websocket message from a client (65536)
  DROPLINE_STREAM_INIT_TIMEOUT         time to send connection_init (3s)
  DROPLINE_STREAM_PING_INTERVAL        ping and SSE keep-alive interval (15s)
  DROPLINE_STREAM_WRITE_TIMEOUT        bound on each websocket write (10s)
  DROPLINE_LIVE_INTERVAL               longest a SKU's change waits for its previous fan-out (a fifth of it: the shortest gap), 1ms-1s (100ms)
  DROPLINE_APQ_BYTES_PER_ADDR          persisted-query bytes one client address may register (1048576)
  DROPLINE_BODY_TIMEOUT                time to send a request body once its headers are in, 1s-1m (10s)
  DROPLINE_REQUESTS_PER_ADDR           requests in flight per client address, streams aside (1024)
  DROPLINE_GATE_SLOTS                  queries and mutations other than commits and cancels run at once, 0 = off (default; 8 per core to start)
  DROPLINE_GATE_WAIT                   longest wait for a slot of that gate, 100ms-1m (10s)
  DROPLINE_TRUSTED_DOCUMENTS           manifest of the only documents that run, by id; APQ off (any document runs)
  DROPLINE_SUBGRAPH                    1 = serve Federation v2 _service and _entities for a gateway (off)
  DROPLINE_WEBHOOK_TIMEOUT             bound of one webhook delivery attempt, 100ms-1m (10s)
  DROPLINE_WEBHOOK_CONCURRENCY         deliveries in flight per endpoint per instance, 1-64 (4)
  DROPLINE_WEBHOOK_MAX_ATTEMPTS        attempts before a delivery is a dead letter, 1-100 (12)
  DROPLINE_WEBHOOK_BACKOFF             wait after a failed attempt, doubling per failure (1s)
  DROPLINE_WEBHOOK_BACKOFF_MAX         longest such wait (1h)
  DROPLINE_WEBHOOK_RETENTION           how long ended deliveries and their events are kept, 1m-8760h (168h)
  DROPLINE_SHUTDOWN_TIMEOUT  (15s)
  DROPLINE_LOG_LEVEL         (info)
  DROPLINE_LOG_FORMAT        json|console (json; console in dev mode)
  DROPLINE_ADMIN_ADDR        loopback host:port of the admin listener: pprof, /readyz with reasons (none)
  DROPLINE_ADMIN_ALLOW_REMOTE 1 = the admin listener may use a non-loopback address (off)
  DROPLINE_METRICS_LISTENER  public|admin: the listener that serves /metrics (public)
  OTEL_EXPORTER_OTLP_ENDPOINT         OTLP/HTTP collector: turns traces on; the other OTEL_* variables apply (none)
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  the same, for traces alone, with its path (none)
  GOGC                       the Go garbage collector's target (400 for serve; Go's own default is 100)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, stop, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env bundles what a subcommand may touch, so tests run the real commands
// with their own environment and buffers.
type env struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
	// stopSignals restores default signal handling once shutdown has begun,
	// so a second Ctrl-C kills the process at once.
	stopSignals func()
}

// run executes one command line and returns the exit code. ctx is
// cancelled on SIGINT/SIGTERM.
func run(ctx context.Context, stopSignals func(), args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	e := env{getenv: getenv, stdout: stdout, stderr: stderr, stopSignals: stopSignals}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "serve":
		err = e.serve(ctx, rest)
	case "migrate":
		err = e.migrate(ctx, rest)
	case "seed":
		err = e.seed(ctx, rest)
	case "token":
		err = e.token(rest)
	case "verify-draw":
		err = e.verifyDraw(ctx, rest)
	case "verify-queue":
		err = e.verifyQueue(ctx, rest)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "dropline: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "dropline %s: %v\n", cmd, ue.error)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "dropline: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		return exitFail
	}
}

// usageError marks a bad command line (exit 2) apart from a failure (exit 1).
type usageError struct{ error }

// flags returns a FlagSet that reports errors instead of exiting.
func (e env) flags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("dropline "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: dropline %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func (e env) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// loadConfig reads and validates the environment: every command checks the
// whole configuration, so mistakes surface before anything is touched.
func (e env) loadConfig() (config.Config, error) {
	cfg, err := config.Load(e.getenv)
	if err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func (e env) serve(ctx context.Context, args []string) error {
	if err := e.parse(e.flags("serve", "serve"), args); err != nil {
		return err
	}
	cfg, err := e.loadConfig()
	if err != nil {
		return err
	}
	log, logs := e.logger(cfg)
	defer logs.Close()
	app.WarnIfDevSecret(cfg, log)
	if pct, set := defaultGC(e.getenv); set {
		log.Debug().Int("gc_percent", pct).Msg("GOGC is not set; using Dropline's default")
	}

	a := app.New(cfg, log)
	a.Version = version
	if err := a.Start(ctx); err != nil {
		return err
	}

	var failed error
	select {
	case <-ctx.Done():
		log.Info().Dur("timeout", cfg.ShutdownTimeout).Msg("shutting down")
	case <-a.Done():
		failed = a.Err()
	}
	if e.stopSignals != nil {
		e.stopSignals()
	}
	// Shutdown gets its own deadline: ctx is already cancelled by the signal.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	closeErr := a.Stop(sctx)
	if failed != nil {
		return failed
	}
	if closeErr != nil {
		return fmt.Errorf("shutdown: %w", closeErr)
	}
	return nil
}

// DefaultGCPercent is the garbage collector's target when GOGC is unset.
// A request allocates a few tens of kilobytes that die with it, on a heap
// whose live part is small, so Go's default (100) collects very often: at
// 400 dropline spends about a tenth less CPU per reserve, for a heap
// that peaks at a few times the live data. GOGC (and GOMEMLIMIT) still
// apply when set.
const DefaultGCPercent = 400

// defaultGC sets DefaultGCPercent unless GOGC is set; it reports the value
// and whether it set it.
func defaultGC(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	debug.SetGCPercent(DefaultGCPercent)
	return DefaultGCPercent, true
}

func (e env) migrate(ctx context.Context, args []string) error {
	if err := e.parse(e.flags("migrate", "migrate"), args); err != nil {
		return err
	}
	cfg, err := e.loadConfig()
	if err != nil {
		return err
	}
	log, logs := e.logger(cfg)
	defer logs.Close()
	a := app.New(cfg, log)
	return closeAfter(ctx, a, a.Migrate(ctx))
}

func (e env) seed(ctx context.Context, args []string) error {
	fs := e.flags("seed", "seed --demo")
	demo := fs.Bool("demo", false, "create the demo catalogue: a few products and one hot SKU with small stock, sale window open now")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if !*demo {
		return usageError{errors.New("nothing to seed: pass --demo to create the demo catalogue")}
	}
	cfg, err := e.loadConfig()
	if err != nil {
		return err
	}
	log, logs := e.logger(cfg)
	defer logs.Close()
	a := app.New(cfg, log)
	return closeAfter(ctx, a, a.SeedDemo(ctx))
}

// logger builds the root logger and hands go-redis' own messages to it.
// Close the Closer when the command is done: it writes the lines still
// waiting (app.NewLogger).
func (e env) logger(cfg config.Config) (zerolog.Logger, io.Closer) {
	log, c := app.NewLogger(cfg, e.stderr)
	redis.SetLogger(app.NewRedisLogger(log))
	return log, c
}

// closeAfter closes a one-shot App and returns the command's error first.
func closeAfter(ctx context.Context, a *app.App, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.Config.ShutdownTimeout)
	defer cancel()
	closeErr := a.Stop(ctx)
	if err != nil {
		return err
	}
	return closeErr
}

// maxTokenTTL bounds `dropline token --ttl`: a leaked long-lived token is a
// standing credential.
const maxTokenTTL = 365 * 24 * time.Hour

func (e env) token(args []string) error {
	fs := e.flags("token", "token --user ID [--admin] [--ttl 24h]")
	user := fs.String("user", "", "principal ID (1-128 characters of A-Z a-z 0-9 . _ @ -)")
	admin := fs.Bool("admin", false, "grant the admin role")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid (at most DROPLINE_JWT_MAX_LIFETIME, which is also the default when shorter)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *user == "" {
		return usageError{errors.New("--user is required")}
	}
	if err := auth.ValidatePrincipalID(*user); err != nil {
		return usageError{fmt.Errorf("--user %q: %w", *user, err)}
	}
	if *ttl <= 0 || *ttl > maxTokenTTL {
		return usageError{fmt.Errorf("--ttl %s: must be between 1s and %s", *ttl, maxTokenTTL)}
	}

	cfg, err := config.Load(e.getenv)
	if err != nil {
		return err
	}
	// With neither a secret nor dev mode, sign with the development secret
	// and say so: such a token is accepted only by a server in dev mode
	// (`make run`), which is what someone without a secret is running.
	if cfg.JWTSecret == "" && !cfg.Dev {
		cfg.Dev = true
		cfg.DevAllowRemote = true // token listens nowhere: its address does not matter
		fmt.Fprintf(e.stderr, "dropline token: %s is not set; signed with the development secret, accepted only by a server with %s=1\n", config.EnvJWTSecret, config.EnvDev)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	iss, err := app.NewIssuer(cfg)
	if err != nil {
		return err
	}
	ttlSet := false
	fs.Visit(func(f *flag.Flag) { ttlSet = ttlSet || f.Name == "ttl" })
	if limit := iss.MaxLifetime(); limit > 0 && !ttlSet {
		*ttl = min(*ttl, limit)
	}
	if limit := iss.MaxLifetime(); limit > 0 && *ttl > limit {
		return usageError{fmt.Errorf("--ttl %s: longer than %s (%s), which the server would refuse", *ttl, config.EnvJWTMaxLifetime, limit)}
	}
	tok, err := iss.Mint(*user, *admin, *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, tok)
	return nil
}

func versionString() string {
	v := "dropline " + version
	if bi, ok := debug.ReadBuildInfo(); ok {
		v += " " + bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
	}
	return v
}
