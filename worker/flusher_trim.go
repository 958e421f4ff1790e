package worker

import (
	"context"
	"time"

	"github.com/dropline/dropline/inventory"
)

// trimAndMeasure trims each owned stream below what is acknowledged and
// refreshes the lag, backlog and dead-letter gauges.
func (f *Flusher) trimAndMeasure(ctx context.Context) error {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	now, err := f.outbox.Clock(sctx)
	cancel()
	if err != nil {
		return err
	}
	var lag time.Duration
	var backlog, dead int64
	for p := range inventory.Partitions {
		if !f.leases.Held(p) {
			continue
		}
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		s, err := f.outbox.State(sctx, p)
		cancel()
		if err != nil {
			return err
		}
		backlog += s.Backlog
		dead += s.DeadLetters
		lag = max(lag, s.Lag(now))
		if s.TrimBelow != "" {
			sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
			err := f.outbox.Trim(sctx, p, s.TrimBelow)
			cancel()
			if err != nil {
				return err
			}
		}
	}
	f.m.lag.Set(lag.Seconds())
	f.m.backlog.Set(float64(backlog))
	f.m.deadLetters.Set(float64(dead))
	f.measured.Signal(struct{}{})
	return nil
}
