package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// Defaults of Config, exported so the program's configuration refers to them
// instead of repeating them.
const (
	DefaultKeyPrefix      = "dl:"
	DefaultHoldDuration   = 10 * time.Minute
	DefaultMinHold        = time.Second
	DefaultMaxHold        = time.Hour
	DefaultMaxQuantity    = 100
	DefaultIdempotencyTTL = 24 * time.Hour
	DefaultRejectionTTL   = 5 * time.Minute
	DefaultRetention      = 24 * time.Hour
	DefaultCommitTimeout  = 5 * time.Second
	DefaultRebuildBatch   = 1000
	DefaultMaxExtensions  = 2
	DefaultWaitTimeout    = 50 * time.Millisecond
	DefaultWaitlistMax    = 10_000
	// MaxWaitlistMax is the largest WaitlistMax allowed: a release that
	// finds no waiter able to take its units walks the whole queue.
	MaxWaitlistMax = 100_000
)

// Config tunes the engine. Zero values take the defaults named on each field
// (the DefaultX constants).
type Config struct {
	// KeyPrefix starts every Redis key; default "dl:". It must not contain
	// braces. Tests use their own prefix to share one Redis.
	KeyPrefix string
	// DefaultHold is how long a hold lasts when the caller does not say;
	// default 10 minutes.
	DefaultHold time.Duration
	// MinHold and MaxHold bound what a caller may ask for; defaults 1 second
	// and 1 hour. Holds must outlast the checkout's real latency.
	MinHold time.Duration
	MaxHold time.Duration
	// MaxQuantity bounds the units one reserve may take; default 100.
	MaxQuantity int
	// MaxExtensions is how many times a hold may be extended (Extend);
	// default 2, a negative value allows none. However often it is
	// extended, a hold never lasts past MaxHold after its creation.
	MaxExtensions int
	// IdempotencyTTL is how long a reserve's hold is replayed for its
	// idempotency key; default 24 hours.
	IdempotencyTTL time.Duration
	// RejectionTTL is how long a rejected reserve (out of stock, over the
	// quota, sale not open) is replayed for its idempotency key; default 5
	// minutes, at most IdempotencyTTL. Redis keeps a rejection's record and
	// its key's claim this long (and a refused cart's, with the lines it
	// held and let go), so it bounds what one principal can make Redis keep
	// by being refused: about 530 bytes per rejection (640 per line of a
	// refused cart), times the principal's mutation rate, times this TTL.
	// After it, the key is a new request.
	RejectionTTL time.Duration
	// Retention is how long a finished hold stays readable in Redis (Postgres
	// keeps it for ever); default 24 hours.
	Retention time.Duration
	// CommitTimeout bounds the Postgres write of a commit; default 5 seconds.
	CommitTimeout time.Duration
	// RebuildBatch is how many reservations one script of a rebuild writes
	// (see Rebuild); default 1,000, about 17 ms of Redis' time per script
	// on a busy 2-core machine. Redis runs nothing else meanwhile, so this
	// bounds the stall a rebuild causes to every other request.
	RebuildBatch int
	// WaitReplicas, when positive, makes every reserve and every commit's
	// last Redis step wait (Redis WAIT, on the connection that ran the
	// script) until that many replicas have its write before answering, so
	// that a failover soon after loses fewer acknowledged holds. Default 0:
	// no wait. Only for a single primary (with Sentinel); a cluster client
	// is refused. WAIT narrows the window, it does not close it: a replica
	// that acknowledged may still not be the one promoted.
	WaitReplicas int
	// WaitTimeout bounds each WAIT; default 50 ms when WaitReplicas is set.
	// On timeout the answer is given anyway, with the write on the primary
	// and on fewer replicas: the caller is never refused for slow
	// replication (the script cannot be rolled back, and refusing would
	// only hide a hold that exists). Each short wait is counted in
	// dropline_redis_wait_short_total.
	WaitTimeout time.Duration
	// WaitlistMax bounds how many principals may wait on one SKU at once
	// (WAITING entries); default 10,000. A release walks at most this many
	// waiters when none can take what it freed.
	WaitlistMax int
	// CartSettle is how long a cart may take to hold all its lines
	// (ReserveCart); default 2 seconds. It is also how long the lines of a
	// cart whose caller died mid-way keep their units from other buyers
	// (plus the sweep's delay), so it must stay well under 5 seconds.
	CartSettle time.Duration
	// CartPause makes ReserveCart wait between two of its steps. Test only:
	// the fault tests set it to kill a server in the middle of a cart. The
	// zero value (the default) never pauses, as in every real deployment.
	CartPause CartPause
	// DrawPause makes RunDraw wait at one of its steps. Test only: the fault
	// tests set it to kill a server in the middle of a draw. The zero value
	// (the default) never pauses, as in every real deployment.
	DrawPause DrawPause
	// Registerer receives the engine's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Tracer, when set, gives each script run inside a traced operation a
	// span, and each run of reserve.lua links the reserves it decided
	// (and carries their trace into the outbox); each PostgreSQL
	// transaction of the ledger inside one gets a span too (db.Ledger.Traced).
	// Nil: tracing off, and no span, link or trace context is made.
	Tracer trace.TracerProvider
	// SalePool, when set, is the ledger's pool for the commits' sales
	// (db.Ledger.WithSalePool, db.SaleConns connections); nil: the sales
	// share the engine's pool. The caller closes it.
	SalePool *pgxpool.Pool
}

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.DefaultHold == 0 {
		c.DefaultHold = DefaultHoldDuration
	}
	if c.MinHold == 0 {
		c.MinHold = DefaultMinHold
	}
	if c.MaxHold == 0 {
		c.MaxHold = DefaultMaxHold
	}
	if c.MaxQuantity == 0 {
		c.MaxQuantity = DefaultMaxQuantity
	}
	if c.MaxExtensions == 0 {
		c.MaxExtensions = DefaultMaxExtensions
	}
	if c.IdempotencyTTL == 0 {
		c.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if c.RejectionTTL == 0 {
		// Zero is the default, never a clamp: a rejection may not outlive
		// its key's idempotency record.
		c.RejectionTTL = min(DefaultRejectionTTL, c.IdempotencyTTL)
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.RebuildBatch == 0 {
		c.RebuildBatch = DefaultRebuildBatch
	}
	if c.WaitReplicas > 0 && c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.WaitlistMax == 0 {
		c.WaitlistMax = DefaultWaitlistMax
	}
	if c.CartSettle == 0 {
		c.CartSettle = DefaultCartSettle
	}
}

func (c *Config) validate() error {
	if regexp.MustCompile(`[{}]`).MatchString(c.KeyPrefix) {
		return fmt.Errorf("key prefix %q must not contain braces", c.KeyPrefix)
	}
	if c.MinHold < time.Second || c.MaxHold < c.MinHold || c.DefaultHold < c.MinHold || c.DefaultHold > c.MaxHold {
		return fmt.Errorf("hold durations must satisfy 1s <= min (%s) <= default (%s) <= max (%s)", c.MinHold, c.DefaultHold, c.MaxHold)
	}
	if c.MaxQuantity < 1 {
		return fmt.Errorf("max quantity must be at least 1")
	}
	if c.RejectionTTL < time.Second || c.RejectionTTL > c.IdempotencyTTL {
		return fmt.Errorf("rejection TTL (%s) must be between 1s and the idempotency TTL (%s)", c.RejectionTTL, c.IdempotencyTTL)
	}
	if c.RebuildBatch < 1 || c.RebuildBatch > 50_000 {
		return fmt.Errorf("rebuild batch (%d) must be between 1 and 50000", c.RebuildBatch)
	}
	if c.WaitReplicas < 0 || (c.WaitReplicas > 0 && c.WaitTimeout <= 0) {
		return fmt.Errorf("waiting for %d replicas needs a positive timeout (%s)", c.WaitReplicas, c.WaitTimeout)
	}
	if c.WaitlistMax < 1 || c.WaitlistMax > MaxWaitlistMax {
		return fmt.Errorf("waitlist max (%d) must be between 1 and %d", c.WaitlistMax, MaxWaitlistMax)
	}
	if c.CartSettle < 100*time.Millisecond || c.CartSettle > 4*time.Second {
		// Beyond 4 s, an interrupted cart could keep units from other buyers
		// for more than the 5 s the contract allows.
		return fmt.Errorf("cart settle time (%s) must be between 100ms and 4s", c.CartSettle)
	}
	if err := c.CartPause.Validate(); err != nil {
		return err
	}
	if err := c.DrawPause.Validate(); err != nil {
		return err
	}
	if c.Retention < c.IdempotencyTTL {
		// An idempotency record replays its hold: the hold must live as long.
		return fmt.Errorf("retention (%s) must be at least the idempotency TTL (%s)", c.Retention, c.IdempotencyTTL)
	}
	return nil
}

// ClusterStateReloadInterval is the longest a Redis Cluster client may go
// without reading the cluster's slot map again (go-redis' ClusterOptions,
// whose default is a minute); NewEngine refuses a client with a longer one.
// go-redis reads it again at once only on a MOVED or READONLY reply, which
// a master that died never sends: after the cluster promotes its replica,
// every command for its slots goes on to the dead address until the next
// reading. At the default that was 52 s after the promotion
// (TestClusterFailoverMidDrop); at a second it costs each process one
// CLUSTER SLOTS a second while commands flow.
const ClusterStateReloadInterval = time.Second

// Principal is who is calling: the subject of a verified token.
type Principal = core.Principal

// Engine is Dropline's inventory: the only code that changes stock and holds.
// Redis holds the live state and runs every change as one Lua script;
// Postgres is the durable ledger, written first for commits and products.
type Engine struct {
	cfg Config
	rdb redis.UniversalClient
	// hot runs reserve.lua and claim_idempotency_key.lua (which every
	// reserve with an idempotency key runs first): the client's
	// autopipeliner, which sends the scripts of concurrent reserves to
	// Redis together (one write and one read for a batch instead of one
	// round trip each). Every script still runs on its own, atomically;
	// only the transport is shared.
	hot     hotClient
	ledger  *db.Ledger
	keys    Keys
	scripts map[string]*redis.Script
	// functions are the scripts run as Redis functions (lua.Functions), by
	// script name.
	functions map[string]function
	log       zerolog.Logger
	rebuild   singleflight.Group
	metrics   *metrics
	batches   reserveBatcher
	// tracer is nil when tracing is off (Config.Tracer).
	tracer trace.Tracer
	// core is what the engine hands its aggregates (newCore).
	core *core.Core
	// carts are the engine's carts (newCarts).
	carts Carts
	// draws are the engine's draws (newDraws), which gather concurrent
	// entries into one transaction.
	draws Draws
	// restoreQueue restores a queue lost with Redis from the ledger
	// (RestoreQueuesWith); nil until set.
	restoreQueue atomic.Pointer[func(ctx context.Context, queueID string) error]
	// soldOut answers reserves of SKUs known sold out (RememberSoldOut); nil
	// when unset. budgets spends the rate budgets of those answers.
	soldOut atomic.Pointer[SoldOutMemory]
	budgets localBudgets
	// rebuildPublished, when set (by tests only), runs after a rebuild has
	// published a SKU and before its snapshot's transaction ends.
	rebuildPublished func(sku string)
}

// RestoreQueuesWith sets how a rebuild of a queued SKU restores its queue
// (its own, or its drop's) before the SKU goes live, so that a reserve never
// finds the SKU back without the admission passes: package inventory/queue
// sets it (its Service.RestoreID), which this package cannot import.
func (e *Engine) RestoreQueuesWith(fn func(ctx context.Context, queueID string) error) {
	e.restoreQueue.Store(&fn)
}

// NewEngine builds the engine and loads its scripts into Redis (every node of a
// cluster). Scripts are run by SHA afterwards and reloaded on NOSCRIPT.
func NewEngine(ctx context.Context, cfg Config, rdb redis.UniversalClient, pool *pgxpool.Pool, log zerolog.Logger) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("inventory config: %w", err)
	}
	e := &Engine{
		cfg: cfg, rdb: rdb, ledger: db.NewLedger(pool).WithSalePool(cfg.SalePool).Traced(cfg.Tracer), keys: NewKeys(cfg.KeyPrefix),
		scripts: map[string]*redis.Script{}, log: log, metrics: newMetrics(cfg.Registerer),
		tracer: tracing.Tracer(cfg.Tracer, tracerName),
	}
	if cc, cluster := rdb.(*redis.ClusterClient); cluster {
		if cfg.WaitReplicas > 0 {
			return nil, fmt.Errorf("inventory config: waiting for replicas needs a single primary (redis:// or redis-sentinel://), not a cluster")
		}
		if every := cc.Options().ClusterStateReloadInterval; every > ClusterStateReloadInterval {
			return nil, fmt.Errorf("inventory config: the cluster client reads the slot map every %s; at most %s, or the slots of a promoted replica stay out of reach that long", every, ClusterStateReloadInterval)
		}
	}
	e.core = e.newCore()
	e.carts = e.newCarts()
	e.draws = e.newDraws()
	e.hot = rdb
	if ap, err := rdb.AutoPipeline(); err == nil {
		e.hot = ap
	}
	for _, name := range lua.Engine {
		src, err := lua.Source(name)
		if err != nil {
			return nil, err
		}
		e.scripts[name] = redis.NewScript(src)
	}
	e.functions = map[string]function{}
	for _, name := range lua.Functions {
		code, fn, err := lua.Function(name)
		if err != nil {
			return nil, err
		}
		e.functions[name] = function{name: fn, code: code}
	}
	if err := checkLayout(ctx, rdb, e.keys); err != nil {
		return nil, err
	}
	if err := e.LoadScripts(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// LoadScripts loads every script into Redis, and the functions into every
// primary (a replica has them from its primary, before and after a
// failover). Running by SHA recovers from a SCRIPT FLUSH on its own, and a
// function's call from a Redis that lost it (a new server, FUNCTION FLUSH)
// by loading again; this exists for start-up and readiness.
func (e *Engine) LoadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for name, s := range e.scripts {
			if err := s.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("loading script %s: %w", name, err)
			}
		}
		return nil
	}
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) }); err != nil {
			return err
		}
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return e.loadFunctions(ctx, c) })
	}
	if err := load(ctx, e.rdb); err != nil {
		return err
	}
	return e.loadFunctions(ctx, e.rdb)
}

// loadFunctions loads the engine's functions into one Redis: a library
// loaded already (by another instance of the same build) is left as it is.
func (e *Engine) loadFunctions(ctx context.Context, c redis.Cmdable) error {
	for name, f := range e.functions {
		if err := c.FunctionLoad(ctx, f.code).Err(); err != nil && !isLoadedAlready(err) {
			return fmt.Errorf("loading function %s: %w", name, err)
		}
	}
	return nil
}

// Ping reports whether Redis answers and the scripts are loaded, for
// readiness: reserve.lua's function, which a Redis that lost it (a new
// server) gets again.
func (e *Engine) Ping(ctx context.Context) error {
	f := e.functions[lua.Reserve]
	check := func(ctx context.Context, c redis.Cmdable) error {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: f.name}).Result()
		if err != nil {
			return err
		}
		if len(libs) == 0 {
			return e.loadFunctions(ctx, c)
		}
		return nil
	}
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return check(ctx, c) })
	}
	return check(ctx, e.rdb)
}

// function is a script the engine runs as a Redis function (lua.Function):
// the function's name and its library's code.
type function struct {
	name, code string
}

// hotClient is what reserve.lua's calls go through: the client, or its
// autopipeliner.
type hotClient interface {
	redis.Scripter
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

// isLoadedAlready says a FUNCTION LOAD found its library there.
func isLoadedAlready(err error) bool {
	return redis.HasErrorPrefix(err, "Library ") && strings.Contains(err.Error(), "already exists")
}

// isNoFunction says an FCALL found no such function: the Redis lost it, or
// never had it (a new server, FUNCTION FLUSH).
func isNoFunction(err error) bool { return redis.HasErrorPrefix(err, "Function not found") }

// fcall runs function f through c, loading the functions once more when the
// Redis has lost them.
func (e *Engine) fcall(ctx context.Context, c hotClient, f function, keys []string, args []any) *redis.Cmd {
	cmd := c.FCall(ctx, f.name, keys, args...)
	if err := cmd.Err(); err != nil && isNoFunction(err) {
		if lerr := e.LoadScripts(ctx); lerr != nil {
			return cmd
		}
		cmd = c.FCall(ctx, f.name, keys, args...)
	}
	return cmd
}

// Keys exposes the key layout to the worker group and to tests.
func (e *Engine) Keys() Keys { return e.keys }

// Redis is the engine's Redis client, for the packages beside the engine
// that keep their keys in its partitions (inventory/queue).
func (e *Engine) Redis() redis.UniversalClient { return e.rdb }

// Ledger exposes the Postgres ledger to tests.
func (e *Engine) Ledger() *db.Ledger { return e.ledger }

// ApplyEvents writes a batch read from the outbox into the ledger, fenced by
// the writer's lease (see db.Ledger.ApplyEvents): the write-behind's one
// Postgres write.
func (m *Maintenance) ApplyEvents(ctx context.Context, fence *db.Fence, events []db.Event) error {
	e := m.e
	return e.ledger.ApplyEvents(ctx, fence, events)
}

// ApplyEventsUnflushed is ApplyEvents for a writer that acknowledges the
// events only once the commit is durable (db.Ledger.ApplyEventsUnflushed).
func (m *Maintenance) ApplyEventsUnflushed(ctx context.Context, fence *db.Fence, events []db.Event) (db.Commit, error) {
	return m.e.ledger.ApplyEventsUnflushed(ctx, fence, events)
}

// Flushed reads the ledger's WAL flush position and which of sessions
// still exist (db.Ledger.Flushed).
func (m *Maintenance) Flushed(ctx context.Context, sessions []db.Session) (uint64, map[db.Session]bool, error) {
	return m.e.ledger.Flushed(ctx, sessions)
}

// Config returns the engine's settings with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// run executes a script by SHA (EVAL on NOSCRIPT) and returns its reply as a
// list. A Redis error is never a business outcome: it is reported as
// ErrUnavailable with its cause.
func (e *Engine) run(ctx context.Context, call script.Call) (_ script.Reply, err error) {
	name, keys, args := call.Script, call.Keys, call.Argv
	var c hotClient = e.rdb
	if name == lua.Reserve || name == lua.ClaimIdempotencyKey {
		c = e.hot
	}
	if name != lua.Reserve && e.tracer != nil {
		var span trace.Span
		ctx, span = e.startScript(ctx, name)
		defer func() { endSpan(span, err) }()
	}
	var res []any
	if f, ok := e.functions[name]; ok {
		res, err = e.fcall(ctx, c, f, keys, args).Slice()
	} else {
		res, err = e.scripts[name].Run(ctx, c, keys, args...).Slice()
	}
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		return nil, unavailable("running "+name, err)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("script %s returned nothing", name)
	}
	return script.Reply(res), nil
}

// runManyChunk is how many runs one round trip of runMany carries.
const runManyChunk = 500

// runMany runs calls of one script, pipelined in chunks of runManyChunk
// (one round trip each), and returns each call's reply or error. Every
// call is its own atomic run, as with run; only the transport is shared.
// A call refused NOSCRIPT (a SCRIPT FLUSH under way) is sent once more after
// the scripts are loaded again: it did not run.
func (e *Engine) runMany(ctx context.Context, name string, calls []script.Call) ([]script.Reply, []error) {
	replies := make([]script.Reply, len(calls))
	errs := make([]error, len(calls))
	s := e.scripts[name]
	for start := 0; start < len(calls); start += runManyChunk {
		todo := make([]int, 0, runManyChunk)
		for i := start; i < min(start+runManyChunk, len(calls)); i++ {
			todo = append(todo, i)
		}
		for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
			cmds := make([]*redis.Cmd, len(todo))
			_, _ = e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for j, i := range todo {
					cmds[j] = s.EvalSha(ctx, p, calls[i].Keys, calls[i].Argv...)
				}
				return nil
			})
			var again []int
			for j, i := range todo {
				vals, err := cmds[j].Slice()
				switch {
				case err != nil && isNoScript(err) && attempt == 0:
					again = append(again, i)
				case err != nil:
					errs[i] = unavailable("running "+name, err)
				case len(vals) == 0:
					errs[i] = fmt.Errorf("script %s returned nothing", name)
				default:
					replies[i], errs[i] = script.Reply(vals), nil
				}
			}
			if len(again) > 0 {
				if err := e.LoadScripts(ctx); err != nil {
					for _, i := range again {
						errs[i] = err
					}
					break
				}
			}
			todo = again
		}
	}
	return replies, errs
}

// runReplicated is run for the steps whose loss in a failover a buyer would
// notice (a reserve, a commit's last step): with WaitReplicas set, it sends
// the script and WAIT in one pipeline, so they run on one connection and
// WAIT covers the script's write. A WAIT that times out is counted, not an
// error (see Config.WaitTimeout).
func (e *Engine) runReplicated(ctx context.Context, call script.Call) (script.Reply, error) {
	if e.cfg.WaitReplicas <= 0 {
		return e.run(ctx, call)
	}
	name, keys, args := call.Script, call.Keys, call.Argv
	s := e.scripts[name]
	exec := func(eval func(redis.Pipeliner) *redis.Cmd) ([]any, int64, error) {
		var res *redis.Cmd
		var acked *redis.Cmd
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			res = eval(p)
			acked = p.Do(ctx, "WAIT", e.cfg.WaitReplicas, e.cfg.WaitTimeout.Milliseconds())
			return nil
		})
		if res == nil {
			return nil, 0, err
		}
		out, rerr := res.Slice()
		if rerr != nil {
			return nil, 0, rerr
		}
		n, werr := acked.Int64()
		if werr != nil {
			return out, 0, werr
		}
		return out, n, nil
	}
	start := time.Now()
	var out []any
	var n int64
	var err error
	if f, ok := e.functions[name]; ok {
		fcall := func(p redis.Pipeliner) *redis.Cmd { return p.FCall(ctx, f.name, keys, args...) }
		out, n, err = exec(fcall)
		if err != nil && isNoFunction(err) {
			if err = e.LoadScripts(ctx); err == nil {
				out, n, err = exec(fcall)
			}
		}
	} else {
		out, n, err = exec(func(p redis.Pipeliner) *redis.Cmd { return s.EvalSha(ctx, p, keys, args...) })
		if err != nil && isNoScript(err) {
			out, n, err = exec(func(p redis.Pipeliner) *redis.Cmd { return s.Eval(ctx, p, keys, args...) })
		}
	}
	if err != nil && out == nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		return nil, unavailable("running "+name, err)
	}
	e.metrics.waited(time.Since(start), err == nil && n >= int64(e.cfg.WaitReplicas))
	if len(out) == 0 {
		return nil, fmt.Errorf("script %s returned nothing", name)
	}
	return script.Reply(out), nil
}

func timeMs(t *time.Time) int64 { return core.TimeMs(t) }
