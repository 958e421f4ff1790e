package worker

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/inventory"
)

// GroupConfig configures the whole worker group. Its Options are the
// defaults of every worker's own Options; zero values take the defaults
// named on each field of the worker configs.
type GroupConfig struct {
	Options
	Sweeper    HoldSweeperConfig
	Flusher    FlusherConfig
	Reconciler CommitReconcilerConfig
	Rebuilder  RebuilderConfig
	Drawer     DrawerConfig
	Webhooks   WebhookDispatcherConfig
	Admitter   AdmitterConfig
}

// Group is the embedded worker group of one server process: the hold
// sweeper, the write-behind flusher, the commit reconciler, the rebuilder
// the drawer and the webhook dispatcher. Each worker supervises its own loop (restart with backoff on an
// error or a panic); the group starts them in dependency order and stops them
// in reverse, the flusher last, so that the events the others emit while
// stopping still reach Postgres before the pools close.
type Group struct {
	Sweeper    *HoldSweeper
	Flusher    *Flusher
	Reconciler *CommitReconciler
	Rebuilder  *Rebuilder
	Drawer     *Drawer
	Webhooks   *WebhookDispatcher
	Admitter   *Admitter
}

// NewGroup builds the group. One Owner is chosen for the process (unless
// given) and shared by every worker, so the process shows up under one name
// in leases and in the consumer group.
func NewGroup(cfg GroupConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Group {
	cfg.setDefaults()
	log = log.With().Str("component", "worker").Logger()
	cfg.Sweeper.inherit(cfg.Options)
	cfg.Flusher.inherit(cfg.Options)
	cfg.Reconciler.inherit(cfg.Options)
	cfg.Rebuilder.inherit(cfg.Options)
	cfg.Drawer.inherit(cfg.Options)
	cfg.Webhooks.inherit(cfg.Options)
	cfg.Admitter.inherit(cfg.Options)
	return &Group{
		Sweeper:    NewHoldSweeper(cfg.Sweeper, engine, rdb, log, reg),
		Flusher:    NewFlusher(cfg.Flusher, engine, rdb, log, reg),
		Reconciler: NewCommitReconciler(cfg.Reconciler, engine, rdb, log, reg),
		Rebuilder:  NewRebuilder(cfg.Rebuilder, engine, rdb, log, reg),
		Drawer:     NewDrawer(cfg.Drawer, engine, rdb, log, reg),
		Webhooks:   NewWebhookDispatcher(cfg.Webhooks, engine.Ledger(), log, reg),
		Admitter:   NewAdmitter(cfg.Admitter, engine.Engine(), rdb, log, reg),
	}
}

// workers in start order: the flusher first, so no event waits; the
// rebuilder before the workers that act on holds; the webhook dispatcher,
// which reads only the ledger, last (and so stopped first).
func (g *Group) workers() []startstop.Service {
	return []startstop.Service{g.Flusher, g.Rebuilder, g.Reconciler, g.Sweeper, g.Drawer, g.Admitter, g.Webhooks}
}

// Start starts every worker; when one fails to start, the ones started are
// stopped again. The workers run until Stop. If ctx ends first, they stop as
// a crashed process would: without releasing their leases (the flusher still
// drains). Starting a started group does nothing.
func (g *Group) Start(ctx context.Context) error {
	if err := startstop.StartAll(ctx, g.workers()...); err != nil {
		return fmt.Errorf("starting the worker group: %w", err)
	}
	return nil
}

// Stop stops the workers in reverse order and waits for each, at most until
// ctx ends: the flusher last, after applying and acknowledging what it has
// read and draining what is left (up to its DrainTimeout). Leases are
// released so other processes take over at once. Stop is idempotent.
func (g *Group) Stop(ctx context.Context) error {
	if err := startstop.StopAll(ctx, g.workers()...); err != nil {
		// The flusher's unacknowledged batch stays pending in Redis and is
		// applied again by whoever owns its partition next.
		return fmt.Errorf("stopping the worker group: %w", err)
	}
	return nil
}
