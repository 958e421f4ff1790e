package startstop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/startstop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loop is a service whose run reports how its context ended.
type loop struct {
	startstop.Base
	ended chan error // the cause of the run's context, once per run
	fail  chan error // an error sent here ends the run on its own
}

func newLoop() *loop { return &loop{ended: make(chan error, 4), fail: make(chan error, 1)} }

func (l *loop) Start(ctx context.Context) error {
	l.Go(ctx, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			l.ended <- context.Cause(ctx)
			if startstop.Stopped(ctx) {
				return errors.New("what the stop cost")
			}
			return nil
		case err := <-l.fail:
			l.ended <- nil
			return err
		}
	})
	return nil
}

func TestStopIsToldApartByItsCause(t *testing.T) {
	t.Parallel()
	l := newLoop()
	require.NoError(t, l.Stop(context.Background()), "stopping a service that never started does nothing")
	require.Nil(t, l.Done(), "no run, nothing to wait for")

	require.NoError(t, l.Start(context.Background()))
	require.NoError(t, l.Start(context.Background()), "starting a running service does nothing")
	err := l.Stop(context.Background())
	require.EqualError(t, err, "what the stop cost", "Stop returns what the run returned after the stop")
	require.ErrorIs(t, <-l.ended, startstop.ErrStop)
	require.NoError(t, l.Err(), "a stop is not a failure")
	require.EqualError(t, l.Stop(context.Background()), "what the stop cost", "stopping twice returns the same")
	require.Empty(t, l.ended, "one run only")
}

func TestParentEndingIsNotAStop(t *testing.T) {
	t.Parallel()
	l := newLoop()
	crash := errors.New("crash")
	ctx, cancel := context.WithCancelCause(context.Background())
	require.NoError(t, l.Start(ctx))
	cancel(crash)
	require.ErrorIs(t, <-l.ended, crash, "the parent's cause, not ErrStop")
	<-l.Done()
	require.NoError(t, l.Stop(context.Background()), "the run had ended on its own")
}

func TestFailureIsReportedByErrAndTheServiceStartsAgain(t *testing.T) {
	t.Parallel()
	l := newLoop()
	require.NoError(t, l.Start(context.Background()))
	l.fail <- errors.New("redis went away")
	<-l.Done()
	require.EqualError(t, l.Err(), "redis went away")
	require.NoError(t, l.Stop(context.Background()), "the failure is Err's, not Stop's")

	require.NoError(t, l.Start(context.Background()), "an ended run can be followed by another")
	require.NoError(t, l.Err(), "the new run has not failed")
	require.Error(t, l.Stop(context.Background()))
	require.Len(t, l.ended, 2)
}

func TestStopWaitsAtMostUntilItsContextEnds(t *testing.T) {
	t.Parallel()
	var s startstop.Base
	release := make(chan struct{})
	deadline := make(chan context.Context, 1)
	s.Go(context.Background(), func(ctx context.Context) error {
		<-ctx.Done()
		deadline <- startstop.StopContext(ctx)
		<-release // a run slower than its caller's patience
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, ctx, <-deadline, "the run sees the context of Stop")
	close(release)
	<-s.Done()
}

func TestStopContextOutsideAStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, startstop.StopContext(ctx).Err(), "without a stop, the caller bounds the work itself")
}

// failing fails to start.
type failing struct{ stopped *[]string }

func (f failing) Start(context.Context) error { return errors.New("cannot bind") }
func (f failing) Stop(context.Context) error  { *f.stopped = append(*f.stopped, "failing"); return nil }

// named notes its start and stop.
type named struct {
	name string
	log  *[]string
}

func (n named) Start(context.Context) error { *n.log = append(*n.log, "start "+n.name); return nil }
func (n named) Stop(context.Context) error  { *n.log = append(*n.log, "stop "+n.name); return nil }

func TestStartAllRollsBackAndStopAllReverses(t *testing.T) {
	t.Parallel()
	var log []string
	a, b := named{"a", &log}, named{"b", &log}
	err := startstop.StartAll(context.Background(), a, nil, b, failing{&log})
	require.EqualError(t, err, "cannot bind")
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, log, "the started ones stop again, in reverse")

	log = nil
	require.NoError(t, startstop.StartAll(context.Background(), a, b))
	require.NoError(t, startstop.StopAll(context.Background(), a, nil, b))
	require.Equal(t, []string{"start a", "start b", "stop b", "stop a"}, log)
}
