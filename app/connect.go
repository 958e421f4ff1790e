package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/cpugate"
	"github.com/dropline/dropline/internal/tracing"
)

// startHint ends every "cannot reach" message: the one command that fixes
// the common case on a developer machine.
const startHint = `start it with "make services"`

// connectPostgres opens the pool and proves it with a round trip, so a
// wrong DATABASE_URL fails at start, not on the first sale.
//
// With tp (tracing on), every query, batch and transaction statement run
// inside a traced operation gets a span (otelpgx), without its parameters.
// conns > 0 sizes the pool at exactly conns connections, kept open; 0
// leaves pgxpool's size (DATABASE_URL's pool_max_conns, or its default).
func connectPostgres(ctx context.Context, dsn string, tp trace.TracerProvider, conns int32) (*pgxpool.Pool, error) {
	where := config.RedactURL(dsn)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%s cannot be parsed: %s", config.EnvDatabaseURL, oneLine(err))
	}
	if conns > 0 {
		pcfg.MaxConns, pcfg.MinConns = conns, conns
		// Opened together, they would also reach MaxConnLifetime together
		// and be replaced at once; spread their ends.
		pcfg.MaxConnLifetimeJitter = pcfg.MaxConnLifetime / 5
	}
	if tp != nil {
		pcfg.ConnConfig.Tracer = otelpgx.NewTracer(
			otelpgx.WithTracerProvider(tracing.ChildOnly(tp)),
			otelpgx.WithDisableConnectionDetailsInAttributes(),
		)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %s", where, oneLine(err))
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, describePostgresError(where, pcfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// connectSalePool opens the ledger's pool for the commits' sales
// (db.Ledger.WithSalePool) with all its db.SaleConns connections, and keeps
// them open: the first commits of a drop do not open connections while the
// storm has the CPU.
func connectSalePool(ctx context.Context, dsn string, tp trace.TracerProvider) (*pgxpool.Pool, error) {
	pool, err := connectPostgres(ctx, dsn, tp, db.SaleConns)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conns := make([]*pgxpool.Conn, 0, db.SaleConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range db.SaleConns {
		c, err := pool.Acquire(pctx)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("opening the sales' connections to PostgreSQL at %s: %s", config.RedactURL(dsn), oneLine(err))
		}
		conns = append(conns, c)
	}
	return pool, nil
}

// describePostgresError turns a failed first contact into one line naming
// the URL, the cause and the fix.
func describePostgresError(where, database string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			return fmt.Errorf("database %q does not exist on PostgreSQL at %s: create it with \"make services\" (or createdb %s)", database, where, database)
		case "28P01", "28000": // invalid_password, invalid_authorization_specification
			return fmt.Errorf("login refused by PostgreSQL at %s (%s): check the user and password in %s", where, pgErr.Message, config.EnvDatabaseURL)
		case "57P03": // cannot_connect_now
			return fmt.Errorf("cannot use PostgreSQL at %s yet (%s): it is starting up or shutting down, retry in a moment", where, pgErr.Message)
		}
		return fmt.Errorf("connection refused by PostgreSQL at %s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("cannot reach PostgreSQL at %s: %s — %s", where, networkCause(err), startHint)
}

// connectRedis builds the client REDIS_URL describes (single node,
// Sentinel or cluster), with the eviction guard on every connection it
// opens, and proves it with PING on every node it knows: a server that
// evicts keys fails here, naming its maxmemory-policy.
//
// With tp (tracing on), every command and pipeline run inside a traced
// operation gets a span (redisotel): a reserve's script run among them.
// Command arguments are left out (they name buyers and tokens).
func connectRedis(ctx context.Context, cfg config.Config, log zerolog.Logger, tp trace.TracerProvider) (redis.UniversalClient, error) {
	opts, err := cfg.RedisOptions()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvRedisURL, err)
	}
	newEvictionGuard(log.With().Str("component", "redis").Logger()).install(opts)
	rdb := opts.NewClient()
	installGateHook(rdb, cfg)
	if tp != nil {
		if err := redisotel.InstrumentTracing(rdb,
			redisotel.WithTracerProvider(tracing.ChildOnly(tp)),
			redisotel.WithDBStatement(false),
			redisotel.WithDialFilter(true),
		); err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("tracing Redis commands: %w", err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pingRedis(pctx, rdb); err != nil {
		_ = rdb.Close()
		return nil, describeRedisError(redisWhere(cfg, opts), err)
	}
	return rdb, nil
}

// installGateHook makes a request give its slot of the gate back while it
// waits for Redis (server/graphql/priority.go), when the gate is on
// (DROPLINE_GATE_SLOTS above 0). With the gate off no request carries a
// ticket, and the hook would only look for one on every command.
func installGateHook(rdb redis.UniversalClient, cfg config.Config) {
	if cfg.GateSlots > 0 {
		rdb.AddHook(cpugate.RedisHook{})
	}
}

func redisWhere(cfg config.Config, opts config.RedisOptions) string {
	if len(cfg.RedisClusterAddrs) > 0 {
		return "cluster " + strings.Join(opts.Addrs(), ",")
	}
	return config.RedactURL(cfg.RedisURL)
}

// pingRedis pings a single node, or every shard of a cluster: a cluster
// with one unreachable master cannot serve the SKUs in its slots.
func pingRedis(ctx context.Context, rdb redis.UniversalClient) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, err)
			}
			return nil
		})
	}
	return rdb.Ping(ctx).Err()
}

func describeRedisError(where string, err error) error {
	var evicting *EvictingRedisError
	if errors.As(err, &evicting) {
		return fmt.Errorf("refusing to serve: %w", evicting)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"):
		return fmt.Errorf("login refused by Redis at %s (%s): check the password in %s", where, oneLine(err), config.EnvRedisURL)
	case strings.HasPrefix(msg, "LOADING"):
		return fmt.Errorf("cannot use Redis at %s yet: it is still loading its dataset, retry in a moment", where)
	case strings.Contains(msg, "cluster support disabled"):
		return fmt.Errorf("cluster mode refused by Redis at %s (it is a single server): use redis:// instead of redis-cluster:// in %s", where, config.EnvRedisURL)
	}
	return fmt.Errorf("cannot reach Redis at %s: %s — %s", where, networkCause(err), startHint)
}

// networkCause names the usual reasons a first contact fails in a few
// words, falling back to the error text on one line.
func networkCause(err error) string {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("unknown host %q", dnsErr.Name)
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return fmt.Sprintf("no answer within %s", connectTimeout)
	}
	return oneLine(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// oneLine keeps multi-error texts (pgconn joins one error per address) on a
// single line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
