package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

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
}

// Group is the embedded worker group of one server process: the hold
// sweeper, the write-behind flusher, the commit reconciler and the
// rebuilder. Each worker supervises its own loop (restart with backoff on an
// error or a panic); the group starts them in dependency order and stops them
// in reverse, the flusher last, so that the events the others emit while
// stopping still reach Postgres before the pools close.
type Group struct {
	Sweeper    *HoldSweeper
	Flusher    *Flusher
	Reconciler *CommitReconciler
	Rebuilder  *Rebuilder

	mu      sync.Mutex
	started bool
}

// NewGroup builds the group. One Owner is chosen for the process (unless
// given) and shared by every worker, so the process shows up under one name
// in leases and in the consumer group.
func NewGroup(cfg GroupConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Group {
	cfg.setDefaults()
	log = log.With().Str("component", "worker").Logger()
	cfg.Sweeper.inherit(cfg.Options)
	cfg.Flusher.inherit(cfg.Options)
	cfg.Reconciler.inherit(cfg.Options)
	cfg.Rebuilder.inherit(cfg.Options)
	return &Group{
		Sweeper:    NewHoldSweeper(cfg.Sweeper, engine, rdb, log, reg),
		Flusher:    NewFlusher(cfg.Flusher, engine, rdb, log, reg),
		Reconciler: NewCommitReconciler(cfg.Reconciler, engine, rdb, log, reg),
		Rebuilder:  NewRebuilder(cfg.Rebuilder, engine, rdb, log, reg),
	}
}

type startStopper interface {
	Start(context.Context) error
	Stop()
}

// workers in start order: the flusher first, so no event waits; the
// rebuilder before the workers that act on holds.
func (g *Group) workers() []startStopper {
	return []startStopper{g.Flusher, g.Rebuilder, g.Reconciler, g.Sweeper}
}

// Start starts every worker. The workers stop when ctx is cancelled, but only
// Stop waits for them and runs the flusher's final drain; call Stop on
// shutdown. Starting a started group does nothing.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return nil
	}
	ws := g.workers()
	for i, w := range ws {
		if err := w.Start(ctx); err != nil {
			for j := i - 1; j >= 0; j-- {
				ws[j].Stop()
			}
			return fmt.Errorf("starting the worker group: %w", err)
		}
	}
	g.started = true
	return nil
}

// Stop stops the workers in reverse order and waits for each: the flusher
// last, after applying and acknowledging what it has read and draining what
// is left (up to its DrainTimeout). Leases are released so other processes
// take over at once. Stop is idempotent.
func (g *Group) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		return
	}
	ws := g.workers()
	for i := len(ws) - 1; i >= 0; i-- {
		ws[i].Stop()
	}
	g.started = false
}
