// Package startstop is the one way a long-lived part of Dropline starts and
// stops: the worker loops, the live hub, the HTTP server and the App that
// assembles them.
//
// A Service has Start(ctx) error, which returns once the service runs in the
// background (or with the reason it could not start), and Stop(ctx) error,
// which asks it to stop and waits until it has, at most until ctx ends. Both
// are idempotent; Stop before Start does nothing.
//
// Services embed Base, which provides Stop, Done and Err: their Start calls
// Base.Go (or Base.StartInit) with the loop to run. Stop cancels the loop's
// context with the cause ErrStop, so the loop tells a stop (Stopped) from
// any other end of its context: a failure cancels with its own cause, and a
// parent context that ends (a test killing a process) leaves the parent's.
// Work that belongs to a clean stop, such as releasing leases, is done by
// the loop itself when Stopped says so, never by a Stop of its own; a loop
// that needs the deadline of the caller of Stop (to drain in-flight HTTP
// requests) reads it with StopContext.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStop is the cause of a run's context when Stop ended it.
var ErrStop = errors.New("service stopped")

// Service is a part of Dropline that runs in the background between Start
// and Stop.
type Service interface {
	// Start starts the service in the background and returns once it runs,
	// or why it could not start. Starting a running service does nothing.
	Start(ctx context.Context) error
	// Stop asks the service to stop and waits until it has, at most until
	// ctx ends (then it returns ctx's error and the service finishes
	// stopping on its own). It is safe to call more than once and on a
	// service that never started.
	Stop(ctx context.Context) error
}

// Stopped reports whether ctx, the context of a run, ended because Stop was
// called, rather than because its parent ended or a failure cancelled it.
func Stopped(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrStop)
}

// StopContext returns, inside a run stopped by Stop, the context the caller
// of Stop passed, which bounds what the run still does before it returns.
// Otherwise (the run's parent ended, or ctx is no run's) it returns ctx
// without its cancellation, so the caller bounds its work itself.
func StopContext(ctx context.Context) context.Context {
	if r, ok := ctx.Value(runKey{}).(*run); ok {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.stopCtx != nil {
			return r.stopCtx
		}
	}
	return context.WithoutCancel(ctx)
}

// Base is embedded by a service to provide Stop, Done and Err. Its zero
// value is ready. A service may run again after a run has ended.
type Base struct {
	mu  sync.Mutex
	cur *run
}

// run is one run of a service, from Go (or StartInit) to its return.
type run struct {
	cancel context.CancelCauseFunc
	done   chan struct{}

	mu      sync.Mutex
	stopCtx context.Context // set by the first Stop
	err     error           // what the run returned when it ended on its own
	stopErr error           // what it returned after Stop
}

type runKey struct{}

// StartInit begins a run and returns its context, which Stop cancels with
// ErrStop, and finish, which the run must call exactly once with its error
// when it returns (or at once, when the service fails to start after all).
// ok is false, and nothing begins, while an earlier run is going on.
func (b *Base) StartInit(ctx context.Context) (runCtx context.Context, finish func(error), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil && !closed(b.cur.done) {
		return ctx, func(error) {}, false
	}
	r := &run{done: make(chan struct{})}
	runCtx, r.cancel = context.WithCancelCause(ctx)
	runCtx = context.WithValue(runCtx, runKey{}, r)
	b.cur = r
	var once sync.Once
	finish = func(err error) {
		once.Do(func() {
			r.mu.Lock()
			if Stopped(runCtx) {
				r.stopErr = err
			} else {
				r.err = err
			}
			r.mu.Unlock()
			r.cancel(nil)
			close(r.done)
		})
	}
	return runCtx, finish, true
}

// Go runs fn in a goroutine of its own, under the run's context (see
// StartInit). It returns false, and runs nothing, while an earlier run is
// going on.
func (b *Base) Go(ctx context.Context, fn func(ctx context.Context) error) bool {
	runCtx, finish, ok := b.StartInit(ctx)
	if !ok {
		return false
	}
	go func() {
		var err error
		defer func() { finish(err) }()
		err = fn(runCtx)
	}()
	return true
}

// Stop cancels the current run with the cause ErrStop and waits for it to
// return, at most until ctx ends. It returns what the run returned after
// the stop (nil when it had already ended on its own: see Err), or ctx's
// error when ctx ended first.
func (b *Base) Stop(ctx context.Context) error {
	b.mu.Lock()
	r := b.cur
	b.mu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	if r.stopCtx == nil {
		r.stopCtx = ctx
	}
	r.mu.Unlock()
	r.cancel(ErrStop)
	select {
	case <-r.done:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.stopErr
	case <-ctx.Done():
		return fmt.Errorf("waiting for the service to stop: %w", ctx.Err())
	}
}

// Done is closed when the current run has returned, on a stop or on its
// own. Before the first run it is nil, which never closes.
func (b *Base) Done() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur == nil {
		return nil
	}
	return b.cur.done
}

// Err returns why the current run ended on its own (a failure), or nil: a
// run still going, ended by Stop, or ended without an error.
func (b *Base) Err() error {
	b.mu.Lock()
	r := b.cur
	b.mu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// StartAll starts services in order. When one fails to start, the ones
// started before it are stopped again, in reverse order, and its error is
// returned. Nil services are skipped.
func StartAll(ctx context.Context, services ...Service) error {
	for i, s := range services {
		if s == nil {
			continue
		}
		if err := s.Start(ctx); err != nil {
			_ = StopAll(context.WithoutCancel(ctx), services[:i]...)
			return err
		}
	}
	return nil
}

// StopAll stops services in reverse order, each waited for before the next
// (all bounded by ctx), and joins their errors. Nil services are skipped.
func StopAll(ctx context.Context, services ...Service) error {
	var errs []error
	for i := len(services) - 1; i >= 0; i-- {
		if services[i] == nil {
			continue
		}
		if err := services[i].Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
