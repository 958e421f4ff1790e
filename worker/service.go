package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// service is the start/stop machinery every worker embeds (river's
// startstop): Start launches one supervised goroutine, Stop cancels it and
// waits, and both are idempotent. The supervisor restarts the worker's loop
// when it returns an error or panics, after a doubling, jittered backoff, and
// says so in the log and in dropline_worker_restarts_total.
type service struct {
	name     string
	opts     Options
	log      zerolog.Logger
	run      func(ctx context.Context) error
	restarts prometheus.Counter

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

func newService(name string, opts Options, log zerolog.Logger, reg prometheus.Registerer, run func(context.Context) error) *service {
	return &service{
		name: name, opts: opts, log: log.With().Str("worker", name).Logger(), run: run,
		restarts: restartsVec(reg).WithLabelValues(name),
	}
}

// Start launches the loop. Calling Start on a running worker does nothing.
// The loop stops when ctx is cancelled or Stop is called.
func (s *service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.cancel, s.done = cancel, done
	go s.supervise(ctx, done)
	return nil
}

// Stop cancels the loop and waits for it to return. It is safe to call more
// than once and on a worker that never started.
func (s *service) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (s *service) supervise(ctx context.Context, done chan struct{}) {
	defer close(done)
	failures := 0
	for {
		began := time.Now()
		err := s.safeRun(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("loop returned before it was stopped")
		}
		// A loop that ran well for a while starts its backoff afresh.
		if time.Since(began) > 2*s.opts.MaxRestartBackoff {
			failures = 0
		}
		delay := backoff(s.opts.MinRestartBackoff, s.opts.MaxRestartBackoff, failures)
		failures++
		s.restarts.Inc()
		s.log.Error().Err(err).Int("failures", failures).Dur("backoff", delay).Msg("worker failed; restarting after backoff")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// safeRun turns a panic of the loop into an error, with the stack in the log.
func (s *service) safeRun(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error().Str("stack", string(debug.Stack())).Interface("panic", r).Msg("worker panicked")
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return s.run(ctx)
}

// backoff is lo·2^failures capped at hi, with up to 20 % jitter so that
// several processes failing together do not retry in step.
func backoff(lo, hi time.Duration, failures int) time.Duration {
	d := lo
	for i := 0; i < failures && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d - time.Duration(rand.Int64N(int64(d)/5+1)) //nolint:gosec // jitter, not a secret
}

// stepContext bounds one Redis or Postgres call.
func stepContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, timeout)
}
