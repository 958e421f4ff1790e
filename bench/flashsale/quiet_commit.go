package flashsale

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// QuietCommitResult is the commit's latency on a quiet server, measured in
// the same rehearsal before the buyers come, beside the commit's latency
// during the storm (the drop's commit operation).
//
// Both p99s are the nearest rank (Percentile): the commit that ceil(0.99n)
// of the n are no slower than. Below 100 commits that is the slowest one,
// so a handful of quiet commits would divide the storm's p99 by their
// worst outlier; the *Rank fields say which commit, counted from the
// slowest, each p99 is.
type QuietCommitResult struct {
	SKU       string    `json:"sku"`
	Commits   int       `json:"commits"`
	Quiet     Quantiles `json:"quiet"`
	QuietRank int       `json:"quietP99Rank"`
	// Storm is the drop's commits (OpCommit, StormCommits requests), and
	// Ratio its p99 ÷ Quiet's.
	Storm        Quantiles `json:"storm"`
	StormCommits int       `json:"stormCommits"`
	StormRank    int       `json:"stormP99Rank"`
	Ratio        float64   `json:"ratio"`
	LoadAvg      string    `json:"loadAvg"`
	// NoOp is the same comparison for the cheapest request the first
	// server answers; nil when the probe was not run.
	NoOp *NoOpResult `json:"noOp,omitempty"`
}

// noOpEvery is how often a no-op request leaves during the storm: about a
// hundred a second, nothing beside the storm's thousands. One that takes
// longer delays the next; none queue up.
const noOpEvery = 10 * time.Millisecond

// NoOpResult is the floor under the commit's comparison: GET /healthz on
// the first server, the quiet commits' own, which touches neither Redis nor
// PostgreSQL, timed from the buyers' process one after the other on the
// quiet server (as many as the quiet commits) and through the storm (one
// every noOpEvery, from the first buyer to the last). What slows a no-op in
// the storm is the wait for the machine's cores, which every request and
// the driver's own goroutines share: a commit, which is such a request and
// more, cannot come back sooner. The p99s are nearest ranks, as the
// commits' are; a failed request is counted, not timed.
type NoOpResult struct {
	Quiet      Quantiles `json:"quiet"`
	QuietN     int       `json:"quietRequests"`
	QuietRank  int       `json:"quietP99Rank"`
	QuietFails int       `json:"quietFailed"`
	Storm      Quantiles `json:"storm"`
	StormN     int       `json:"stormRequests"`
	StormRank  int       `json:"stormP99Rank"`
	StormFails int       `json:"stormFailed"`
	Ratio      float64   `json:"ratio"`
}

// noOps times GET /healthz on c: n of them one after the other, or, with
// stop set, one every interval until stop is closed. It returns the
// answered requests' latencies and how many failed.
func noOps(ctx context.Context, c *Client, n int, every time.Duration, stop <-chan struct{}) (lat []time.Duration, failed int) {
	one := func() {
		t0 := time.Now()
		if err := c.Health(ctx); err != nil {
			failed++
		} else {
			lat = append(lat, time.Since(t0))
		}
	}
	if stop == nil {
		for range n {
			one()
			if ctx.Err() != nil {
				break
			}
		}
		return lat, failed
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		one()
		select {
		case <-stop:
			return lat, failed
		case <-ctx.Done():
			return lat, failed
		case <-t.C:
		}
	}
}

// stormNoOps starts timing no-ops on the quiet commits' server, one every
// noOpEvery, until the returned function is called, which hands the
// storm's figures to q.NoOp.
func (q *QuietCommitResult) stormNoOps(ctx context.Context, c *Client) (stop func()) {
	if q == nil || q.NoOp == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		lat, failed := noOps(ctx, c, 0, noOpEvery, done)
		q.NoOp.Storm, q.NoOp.StormN, q.NoOp.StormRank, q.NoOp.StormFails = quantiles(lat), len(lat), p99Rank(len(lat)), failed
	}()
	return func() {
		close(done)
		<-finished
	}
}

// p99Rank is which of n samples, counted from the slowest (1), is their
// p99 by Percentile; 0 for none.
func p99Rank(n int) int {
	if n == 0 {
		return 0
	}
	i := int(math.Ceil(0.99*float64(n))) - 1
	return n - max(0, min(i, n-1))
}

// quietCommits creates a SKU of cfg.QuietCommits units of its own (the
// drop's stock and verdict are not touched) and has as many buyers, one
// after the other, reserve a unit and commit it; each commit is timed. Then
// as many no-op requests are timed on the same server (NoOpResult).
func (d *Driver) quietCommits(ctx context.Context) (*QuietCommitResult, error) {
	cfg := d.cfg
	n := cfg.QuietCommits
	sku := "QUIET-" + cfg.RunID
	admin, err := d.issuer.Mint("flashsale-admin-quiet", true, time.Hour)
	if err != nil {
		return nil, err
	}
	c := d.clients[0]
	ue, err := c.CreateProduct(ctx, admin, ProductInput{SKU: sku, Name: "flashsale quiet commits " + cfg.RunID, Stock: n})
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", sku, err)
	}
	if ue != nil {
		return nil, fmt.Errorf("creating %s: %s: %s", sku, ue.Code, ue.Message)
	}
	res := &QuietCommitResult{SKU: sku}
	lat := make([]time.Duration, 0, n)
	for i := range n {
		bearer, err := d.issuer.Mint("fs-"+cfg.RunID+"-quiet-"+strconv.Itoa(i), false, time.Hour)
		if err != nil {
			return nil, err
		}
		hold, ue, err := c.Reserve(ctx, bearer, ReserveInput{SKU: sku, Quantity: 1,
			IdempotencyKey: "flashsale-" + cfg.RunID + "-quiet-" + strconv.Itoa(i), HoldSeconds: int(cfg.Hold / time.Second)})
		if err != nil {
			return nil, fmt.Errorf("quiet reserve %d: %w", i, err)
		}
		if ue != nil {
			return nil, fmt.Errorf("quiet reserve %d: %s: %s", i, ue.Code, ue.Message)
		}
		t0 := time.Now()
		_, ue, err = c.Commit(ctx, bearer, hold.Token)
		lat = append(lat, time.Since(t0))
		if err != nil {
			return nil, fmt.Errorf("quiet commit %d: %w", i, err)
		}
		if ue != nil {
			return nil, fmt.Errorf("quiet commit %d: %s: %s", i, ue.Code, ue.Message)
		}
	}
	res.Commits, res.Quiet, res.QuietRank = len(lat), quantiles(lat), p99Rank(len(lat))
	noop, failed := noOps(ctx, c, n, 0, nil)
	res.NoOp = &NoOpResult{Quiet: quantiles(noop), QuietN: len(noop), QuietRank: p99Rank(len(noop)), QuietFails: failed}
	return res, nil
}

// compareStorm fills in the storm's commit latency from the drop's
// operations and the ratio of the two p99s.
func (q *QuietCommitResult) compareStorm(ops []OpStats, load string) {
	if q == nil {
		return
	}
	q.LoadAvg = load
	for _, o := range ops {
		if o.Op == OpCommit {
			q.Storm = Quantiles{P50ms: o.P50ms, P99ms: o.P99ms, MaxMs: o.MaxMs}
			q.StormCommits, q.StormRank = o.Requests, p99Rank(o.Requests)
		}
	}
	if q.Quiet.P99ms > 0 {
		q.Ratio = q.Storm.P99ms / q.Quiet.P99ms
	}
	if n := q.NoOp; n != nil && n.Quiet.P99ms > 0 && n.StormN > 0 {
		n.Ratio = n.Storm.P99ms / n.Quiet.P99ms
	}
}

// rankWord names a p99's rank for the report: "the slowest", "the 4th
// slowest".
func rankWord(rank int) string {
	switch {
	case rank <= 1:
		return "the slowest"
	case rank%10 == 1 && rank%100 != 11:
		return fmt.Sprintf("the %dst slowest", rank)
	case rank%10 == 2 && rank%100 != 12:
		return fmt.Sprintf("the %dnd slowest", rank)
	case rank%10 == 3 && rank%100 != 13:
		return fmt.Sprintf("the %drd slowest", rank)
	}
	return fmt.Sprintf("the %dth slowest", rank)
}
