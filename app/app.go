// Package app assembles a running Dropline out of its parts: it connects to
// Redis and PostgreSQL, builds the domain services, starts the embedded
// worker group and the HTTP server, and tears it all down in order. cmd/
// only loads configuration and calls it; e2e/ starts the real program the
// same way on port 0 (after benbjohnson/wtf's cmd/wtfd Main).
//
// # Wiring
//
// The App depends on the domain packages only through Deps, so it is tested
// on its own with stand-ins; DefaultDeps in wire.go is the production wiring
// (db.Migrate, inventory.NewEngine, graphql.NewHandler, worker.NewGroup and
// the demo catalogue).
//
// # Lifecycle
//
// The App is a startstop.Service, like each part it starts. Start connects
// (failing with one clear line when a service is unreachable, or when a
// Redis server evicts keys: see evictionGuard), builds,
// starts the live hub and the workers, then the HTTP server, and returns
// once it listens. Stop ends the live subscriptions, stops accepting and
// drains in-flight requests, stops the workers (which flush and
// acknowledge), then closes the Redis client and the Postgres pool, all
// within the caller's deadline.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/playground"
	"github.com/dropline/dropline/server/shop"
)

// connectTimeout bounds the first contact with Redis and PostgreSQL at
// start, so a wrong address fails in seconds instead of hanging.
const connectTimeout = 5 * time.Second

// Infra is what the App has connected and built by the time it calls the
// domain constructors in Deps. Everything in it is owned (and closed) by the
// App; constructors must not close it.
type Infra struct {
	// Config is the validated configuration.
	Config config.Config
	// Log is the root logger; add a "component" field for each part.
	Log zerolog.Logger
	// Redis is a single-node or cluster client depending on REDIS_URL.
	Redis redis.UniversalClient
	// Postgres is the ledger's connection pool.
	Postgres *pgxpool.Pool
	// SalePool is the ledger's pool for the commits' sales (db.SaleConns
	// connections, opened at start), so that a commit never queues for a
	// connection behind the write-behind; nil outside Start.
	SalePool *pgxpool.Pool
	// Registry receives every metric; /metrics serves it.
	Registry *prometheus.Registry
	// Issuer verifies bearer tokens (and mints them for seeding and tests).
	Issuer *auth.Issuer
	// Tracer makes the spans of traced work; nil when tracing is off
	// (Config.Traces), and then no part makes any span.
	Tracer trace.TracerProvider
}

// Services is what Deps.Build returns: the parts of Dropline that depend on
// the domain packages.
type Services struct {
	// GraphQL serves /graphql. It verifies bearer tokens itself
	// (graphql.NewHandler applies auth.Middleware with Infra.Issuer).
	GraphQL http.Handler
	// Checks are added to /readyz next to redis, postgres and migrations
	// (e.g. {"scripts", engine.Ping}).
	Checks []server.Check
	// Live feeds the GraphQL subscriptions (the live hub). It starts before
	// the HTTP server and stops first, when shutdown begins: its streams
	// (over SSE and websockets) end, and the server's drain of in-flight
	// requests does not wait on them until its deadline. Nil means none.
	Live startstop.Service
	// Workers is the background worker group. It starts before the HTTP
	// server and stops after it has drained, so the events of the last
	// requests are flushed and acknowledged. Nil means no workers.
	Workers startstop.Service
}

// Deps are the domain-layer functions the App calls. They are fields rather
// than imports so the App builds and is tested on its own; DefaultDeps holds
// the production wiring. A nil field disables what it provides, with a
// clear error when a command needs it.
type Deps struct {
	// Migrate applies pending Postgres migrations (db.Migrate).
	Migrate func(ctx context.Context, pool *pgxpool.Pool) error
	// PendingMigrations counts migrations not applied yet (db.Pending);
	// /readyz fails while it is above zero.
	PendingMigrations func(ctx context.Context, pool *pgxpool.Pool) (int, error)
	// Build constructs the domain services once both stores answer.
	Build func(ctx context.Context, in Infra) (Services, error)
	// SeedDemo creates the demo catalogue, idempotently.
	SeedDemo func(ctx context.Context, in Infra) error
}

// App is one running Dropline process, a startstop.Service. Build it with
// New; fields may be adjusted before Start (tests swap Deps).
type App struct {
	// Config is the validated configuration.
	Config config.Config
	// Log is the root logger.
	Log zerolog.Logger
	// Deps connects the domain packages; New sets DefaultDeps().
	Deps Deps
	// Version is recorded on every span as service.version. Default: "dev".
	Version string

	registry *prometheus.Registry
	issuer   *auth.Issuer
	rdb      redis.UniversalClient
	pool     *pgxpool.Pool
	salePool *pgxpool.Pool
	services Services
	server   *server.Server
	admin    *server.AdminServer
	tracing  *tracing.Provider

	running   bool
	closeOnce sync.Once
	closeErr  error
}

// New returns an App for cfg, which the caller has validated. Nothing is
// connected until Start (or Migrate / SeedDemo).
func New(cfg config.Config, log zerolog.Logger) *App {
	return &App{Config: cfg, Log: log, Deps: DefaultDeps(), Version: "dev"}
}

// Start connects to Redis and PostgreSQL, builds the services, starts the
// live hub, the worker group and the HTTP server, and returns once the
// server listens (Addr is then valid). ctx bounds start-up only; the App
// runs until Stop. On failure everything opened so far is closed again and
// the error is one line fit for an operator. An App starts once.
func (a *App) Start(ctx context.Context) (err error) {
	if a.running {
		return errors.New("app already running")
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.Config.ShutdownTimeout)
			defer cancel()
			_ = a.Stop(cctx)
		}
	}()

	if err := a.setup(); err != nil {
		return err
	}
	if err := a.startTracing(ctx); err != nil {
		return err
	}
	if err := a.connect(ctx, true, true); err != nil {
		return err
	}
	if a.salePool == nil {
		if a.salePool, err = connectSalePool(ctx, a.Config.DatabaseURL, a.tracing.TracerProvider()); err != nil {
			return err
		}
	}

	if a.Deps.PendingMigrations != nil {
		n, err := a.Deps.PendingMigrations(ctx, a.pool)
		switch {
		case err != nil:
			a.Log.Warn().Err(err).Msg("cannot tell whether migrations are current")
		case n > 0:
			a.Log.Warn().Int("pending", n).Msg("database migrations are pending: run `dropline migrate`; /readyz stays unavailable until then")
		}
	}

	if a.Deps.Build != nil {
		svc, err := a.Deps.Build(ctx, a.infra())
		if err != nil {
			return fmt.Errorf("starting Dropline: %w", err)
		}
		a.services = svc
	} else {
		a.Log.Warn().Msg("domain services are not wired (app.Deps.Build is nil): /graphql answers 503")
	}

	// Background work gets a context that keeps ctx's values but not its
	// cancellation: it must run until Stop, not until start-up ends.
	bg := context.WithoutCancel(ctx)
	if a.services.Live != nil {
		if err := a.services.Live.Start(bg); err != nil {
			return fmt.Errorf("starting live subscriptions: %w", err)
		}
	}
	if a.services.Workers != nil {
		if err := a.services.Workers.Start(bg); err != nil {
			return fmt.Errorf("starting workers: %w", err)
		}
	}

	var devToken server.DevTokenFunc
	if a.Config.Dev {
		devToken = a.devToken
	}
	metricsOnAdmin := a.Config.MetricsListener == config.MetricsAdmin
	a.server = server.New(server.Config{
		Addr:       a.Config.Addr,
		GraphQL:    a.services.GraphQL,
		Playground: playground.Handler(),
		Shop:       shop.Handler(),
		DevToken:   devToken,
		Checks:     a.checks(),
		Registry:   a.registry,
		Logger:     a.Log,
		ClientAddr: a.Config.ClientAddr(),
		Tracer:     a.tracing.TracerProvider(),

		NoMetrics:        metricsOnAdmin,
		LoopbackHostOnly: a.Config.Dev,
		BodyTimeout:      a.Config.BodyTimeout,
		RequestsPerAddr:  a.Config.RequestsPerAddr,
	})
	if err := a.server.Start(ctx); err != nil {
		return fmt.Errorf("cannot listen on %s (%s): %w — free the port or change DROPLINE_ADDR", config.EnvAddr, a.Config.Addr, errors.Unwrap(err))
	}
	if a.Config.AdminAddr != "" {
		adminCfg := server.AdminConfig{Addr: a.Config.AdminAddr, Logger: a.Log, Checks: a.checks()}
		if metricsOnAdmin {
			adminCfg.Registry = a.registry
		}
		a.admin = server.NewAdmin(adminCfg)
		if err := a.admin.Start(ctx); err != nil {
			return fmt.Errorf("cannot listen on %s (%s): %w — free the port or change %s", config.EnvAdminAddr, a.Config.AdminAddr, errors.Unwrap(err), config.EnvAdminAddr)
		}
		a.Log.Info().Str("admin_addr", a.admin.Addr()).Bool("metrics", metricsOnAdmin).Msg("admin listener (pprof under /debug/pprof/, /readyz with reasons) is open")
	}
	a.running = true
	a.Log.Info().
		Str("addr", a.server.Addr()).
		Str("playground", "http://"+displayAddr(a.server.Addr())+"/").
		Str("shop", "http://"+displayAddr(a.server.Addr())+shop.Prefix).
		Bool("dev", a.Config.Dev).
		Msg("dropline is serving")
	return nil
}

// devTokenTTL is how long the shop's dev sign-in tokens last (or the
// configured maximum token lifetime, when shorter).
const devTokenTTL = 12 * time.Hour

// devToken mints a buyer token for the shop's dev sign-in (POST /dev/token,
// dev mode only). Never an admin one: the shop is a buyer's view.
func (a *App) devToken(user string) (string, error) {
	if err := auth.ValidatePrincipalID(user); err != nil {
		return "", fmt.Errorf("user %q: %w", user, err)
	}
	ttl := devTokenTTL
	if limit := a.issuer.MaxLifetime(); limit > 0 {
		ttl = min(ttl, limit)
	}
	return a.issuer.Mint(user, false, ttl)
}

// Migrate connects to PostgreSQL and applies pending migrations. It is what
// `dropline migrate` runs; Redis is not needed.
func (a *App) Migrate(ctx context.Context) error {
	if a.Deps.Migrate == nil {
		return errors.New("migrations are not wired yet (app.Deps.Migrate is nil)")
	}
	if err := a.setup(); err != nil {
		return err
	}
	if err := a.connect(ctx, true, false); err != nil {
		return err
	}
	if err := a.Deps.Migrate(ctx, a.pool); err != nil {
		return fmt.Errorf("migrating %s: %w", config.RedactURL(a.Config.DatabaseURL), err)
	}
	a.Log.Info().Str("database", config.RedactURL(a.Config.DatabaseURL)).Msg("migrations applied")
	return nil
}

// SeedDemo connects to both stores and creates the demo catalogue. It is
// what `dropline seed --demo` runs; it is idempotent.
func (a *App) SeedDemo(ctx context.Context) error {
	if a.Deps.SeedDemo == nil {
		return errors.New("demo seeding is not wired yet (app.Deps.SeedDemo is nil)")
	}
	if err := a.setup(); err != nil {
		return err
	}
	if err := a.connect(ctx, true, true); err != nil {
		return err
	}
	// Without the schema every query fails with "relation does not exist",
	// which the engine can only report as a store failure; say what to do.
	if a.Deps.PendingMigrations != nil {
		n, err := a.Deps.PendingMigrations(ctx, a.pool)
		if err != nil {
			return fmt.Errorf("checking migrations of %s: %w", config.RedactURL(a.Config.DatabaseURL), err)
		}
		if n > 0 {
			return fmt.Errorf("the database %s lacks %d migration(s): run `dropline migrate` first", config.RedactURL(a.Config.DatabaseURL), n)
		}
	}
	if err := a.Deps.SeedDemo(ctx, a.infra()); err != nil {
		return fmt.Errorf("seeding the demo catalogue: %w", err)
	}
	a.Log.Info().Msg("demo catalogue seeded")
	return nil
}

// Addr returns the address the HTTP server is bound to (with the real port
// when DROPLINE_ADDR asked for port 0), or the configured one before Start.
func (a *App) Addr() string {
	if a.server == nil {
		return a.Config.Addr
	}
	return a.server.Addr()
}

// AdminAddr returns the admin listener's bound address, or "" when
// DROPLINE_ADMIN_ADDR is not set.
func (a *App) AdminAddr() string {
	if a.admin == nil {
		return ""
	}
	return a.admin.Addr()
}

// Done is closed when the HTTP server stops serving on its own (or after
// Stop); main waits on it next to the shutdown signal. Before Start it never
// closes.
func (a *App) Done() <-chan struct{} {
	if a.server == nil {
		return nil
	}
	return a.server.Done()
}

// Err returns why the server stopped serving on its own, or nil.
func (a *App) Err() error {
	if a.server == nil {
		return nil
	}
	return a.server.Err()
}

// Redis exposes the Redis client, for end-to-end tests that inspect state.
func (a *App) Redis() redis.UniversalClient { return a.rdb }

// Postgres exposes the pool, for end-to-end tests that inspect the ledger.
func (a *App) Postgres() *pgxpool.Pool { return a.pool }

// Issuer exposes the token issuer, so end-to-end tests mint tokens the
// running server accepts.
func (a *App) Issuer() *auth.Issuer { return a.issuer }

// Stop shuts down in dependency order: end the live subscriptions, stop
// accepting and drain requests, stop the workers, then close Redis and
// Postgres, all within ctx's deadline; errors are joined. It is idempotent
// and safe after a failed Start.
func (a *App) Stop(ctx context.Context) error {
	a.closeOnce.Do(func() {
		var errs []error
		if a.services.Live != nil {
			if err := a.services.Live.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stopping live subscriptions: %w", err))
			}
		}
		if a.server != nil {
			if err := a.server.Stop(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if a.admin != nil {
			if err := a.admin.Stop(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if a.services.Workers != nil {
			if err := a.services.Workers.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stopping workers: %w", err))
			}
		}
		if a.rdb != nil {
			if err := a.rdb.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
				errs = append(errs, fmt.Errorf("closing Redis client: %w", err))
			}
		}
		// The last spans (the workers' final flush) go out before the
		// stores close; a collector that is gone costs at most 5 s.
		if err := a.tracing.Shutdown(ctx); err != nil {
			a.Log.Warn().Err(err).Msg("traces of the last moments may be lost")
		}
		for _, p := range []struct {
			name string
			pool *pgxpool.Pool
		}{{"the sales'", a.salePool}, {"the ledger's", a.pool}} {
			pool := p.pool
			if pool == nil {
				continue
			}
			closed := make(chan struct{})
			go func() { pool.Close(); close(closed) }()
			select {
			case <-closed:
			case <-ctx.Done():
				// pgxpool.Close waits for acquired connections; give up on
				// them rather than outlive the shutdown deadline.
				errs = append(errs, fmt.Errorf("closing %s Postgres pool: %w", p.name, ctx.Err()))
			}
		}
		a.running = false
		a.closeErr = errors.Join(errs...)
		if a.closeErr != nil {
			a.Log.Error().Err(a.closeErr).Msg("shutdown was not clean")
		} else if a.server != nil {
			a.Log.Info().Msg("dropline stopped")
		}
	})
	return a.closeErr
}

// setup builds what needs no network: the registry and the token issuer.
func (a *App) setup() error {
	if a.registry == nil {
		a.registry = prometheus.NewRegistry()
		prom.Register(a.registry, collectors.NewGoCollector())
		prom.Register(a.registry, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if a.issuer == nil {
		iss, err := NewIssuer(a.Config)
		if err != nil {
			return err
		}
		a.issuer = iss
	}
	return nil
}

func (a *App) infra() Infra {
	return Infra{
		Config:   a.Config,
		Log:      a.Log,
		Redis:    a.rdb,
		Postgres: a.pool,
		SalePool: a.salePool,
		Registry: a.registry,
		Issuer:   a.issuer,
		Tracer:   a.tracing.TracerProvider(),
	}
}

// startTracing starts the OTLP trace exporter when the configuration asks
// for traces (Config.Traces), and routes the OpenTelemetry SDK's own
// errors (an unreachable collector) to the log.
func (a *App) startTracing(ctx context.Context) error {
	if a.tracing != nil {
		return nil
	}
	tp, err := tracing.New(ctx, a.Config.Traces, a.Version)
	if err != nil {
		return err
	}
	a.tracing = tp
	if a.Config.Traces {
		log := a.Log.With().Str("component", "tracing").Logger()
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			log.Warn().Err(err).Msg("exporting traces failed")
		}))
		a.Log.Info().Msg("exporting OpenTelemetry traces over OTLP/HTTP")
	}
	return nil
}

// connect opens the requested stores, each verified with a round trip.
func (a *App) connect(ctx context.Context, postgres, rds bool) error {
	if postgres && a.pool == nil {
		pool, err := connectPostgres(ctx, a.Config.DatabaseURL, a.tracing.TracerProvider(), 0)
		if err != nil {
			return err
		}
		a.pool = pool
	}
	if rds && a.rdb == nil {
		rdb, err := connectRedis(ctx, a.Config, a.Log, a.tracing.TracerProvider())
		if err != nil {
			return err
		}
		a.rdb = rdb
	}
	return nil
}

// checks lists the readiness checks: the stores, the schema, and whatever
// the services add.
func (a *App) checks() []server.Check {
	cs := []server.Check{
		{Name: "postgres", Fn: func(ctx context.Context) error { return a.pool.Ping(ctx) }},
		{Name: "redis", Fn: func(ctx context.Context) error { return pingRedis(ctx, a.rdb) }},
	}
	if a.Deps.PendingMigrations != nil {
		cs = append(cs, server.Check{Name: "migrations", Fn: func(ctx context.Context) error {
			n, err := a.Deps.PendingMigrations(ctx, a.pool)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%d migration(s) pending: run `dropline migrate`", n)
			}
			return nil
		}})
	}
	return append(cs, a.services.Checks...)
}

// displayAddr turns ":8080" into "localhost:8080" for the log line people
// click on.
func displayAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return net.JoinHostPort("localhost", port)
	}
	return addr
}

// NewIssuer builds the token issuer the configuration describes: its key,
// and the issuer, audience and lifetime every token must respect. The server
// verifies with it and `dropline token` mints with it, so the two agree.
func NewIssuer(cfg config.Config) (*auth.Issuer, error) {
	iss, err := auth.NewIssuerWith(auth.IssuerConfig{
		Secret: cfg.JWTKey(), Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, MaxLifetime: cfg.JWTMaxLifetime,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvJWTSecret, err)
	}
	return iss, nil
}
