package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/startstop"
	"github.com/dropline/dropline/internal/testsignal"
)

// service is the start/stop machinery every worker embeds: startstop.Base
// gives it Stop (cancel with the cause startstop.ErrStop, then wait), and
// Start launches one supervised goroutine. Both are idempotent. The
// supervisor restarts the worker's loop when it returns an error or panics,
// after a doubling, jittered backoff, and says so in the log and in
// dropline_worker_restarts_total.
type service struct {
	startstop.Base
	name     string
	opts     Options
	log      zerolog.Logger
	run      func(ctx context.Context) error
	leases   *leaseSet // the loop's partition leases; nil when it has none
	restarts prometheus.Counter
	// restarted signals, to a test, each failure of the loop (how many so
	// far) once it is counted and its restart is due after the backoff.
	restarted testsignal.Signal[int]
}

func newService(name string, opts Options, log zerolog.Logger, reg prometheus.Registerer, leases *leaseSet, run func(context.Context) error) *service {
	return &service{
		name: name, opts: opts, log: log.With().Str("worker", name).Logger(), run: run, leases: leases,
		restarts: restartsVec(reg).WithLabelValues(name),
	}
}

// Start launches the loop. Calling Start on a running worker does nothing.
// The loop stops when Stop is called or ctx ends; only Stop counts as a
// clean stop (the loop then releases its leases), an ended ctx is treated
// like a crash.
func (s *service) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	s.Go(ctx, s.supervise)
	return nil
}

// supervise runs the loop until the service's context ends, restarting it
// after a failure. The partition leases the loop took are released here when
// it ends on a stop (after the flusher's final drain, which the loop runs),
// so other processes take the partitions over at once instead of after a
// TTL; when the context ended otherwise, as a crash would end it, they are
// left to lapse.
func (s *service) supervise(ctx context.Context) error {
	if s.leases != nil {
		defer func() {
			if startstop.Stopped(ctx) {
				s.leases.releaseAll(context.WithoutCancel(ctx))
			}
		}()
	}
	failures := 0
	for {
		began := time.Now()
		err := s.safeRun(ctx)
		if ctx.Err() != nil {
			return nil
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
		s.restarted.Signal(failures)
		s.log.Error().Err(err).Int("failures", failures).Dur("backoff", delay).Msg("worker failed; restarting after backoff")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
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
