package flashsale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/machine"
)

// Buyer outcomes, counted once per buyer in Result.Buyers.
const (
	BuyerCommitted     = "committed"
	BuyerCancelled     = "cancelled"
	BuyerAbandoned     = "abandoned (hold left to expire)"
	BuyerCommitUnknown = "commit outcome unknown"
	BuyerNotStarted    = "not started (duration reached)"
)

// Result is everything one drop produced: what was asked, what was
// measured and the verdict.
type Result struct {
	RunID          string         `json:"runId"`
	SKU            string         `json:"sku"`
	Targets        []string       `json:"targets"`
	Buyers         int            `json:"buyers"`
	Concurrency    int            `json:"concurrency"`
	Quantity       int            `json:"quantity"`
	StartedAt      time.Time      `json:"startedAt"`
	ElapsedSeconds float64        `json:"elapsedSeconds"`
	DrainSeconds   float64        `json:"drainSeconds"`
	Ops            []OpStats      `json:"operations"`
	BuyerOutcomes  map[string]int `json:"buyerOutcomes"`
	Initial        Stock          `json:"initialStock"`
	Final          Stock          `json:"finalStock"`
	Ledger         *LedgerState   `json:"ledger,omitempty"`
	Verdict        Verdict        `json:"verdict"`
	Stock          []StockSample  `json:"stockOverTime"`
	// Watch is what the live watchers measured (--watchers); nil without.
	Watch *WatchResult `json:"watch,omitempty"`
	// QuietCommit is the commit's latency on a quiet server, before the
	// buyers, beside the storm's (--quiet-commits); nil without.
	QuietCommit *QuietCommitResult `json:"quietCommit,omitempty"`
	// FloorWatch is the fan-out floor measured like Watch (--floor-url).
	FloorWatch *FloorWatchResult `json:"floorWatch,omitempty"`
	// Waitlist is the waitlist rehearsal's (--waitlist); nil without.
	Waitlist *WaitlistResult `json:"waitlist,omitempty"`
	// Draw is the draw rehearsal's (--mode draw); nil without.
	Draw *DrawResult `json:"draw,omitempty"`
	// Queue is the queue rehearsal's (--mode queue); nil without.
	Queue *QueueResult `json:"queue,omitempty"`
	// Samples holds every request; it feeds the report, not the JSON.
	Samples []Sample `json:"-"`
}

// Driver runs drops. Build it with NewDriver.
type Driver struct {
	cfg     Config
	clients []*Client
	issuer  *auth.Issuer
	ledger  *LedgerReader
}

// NewDriver validates cfg and connects to the ledger (when DatabaseURL is
// set). Close it when done.
func NewDriver(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.RunID == "" {
		cfg.RunID = strconv.FormatInt(time.Now().UnixMilli()%1e10, 36)
	}
	if err := cfg.Validate(ctx); err != nil {
		return nil, err
	}
	iss, err := auth.NewIssuer(cfg.Secret)
	if err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, issuer: iss}
	per := cfg.Concurrency/len(cfg.Targets) + 1
	for _, t := range cfg.Targets {
		d.clients = append(d.clients, NewClient(Endpoint(t), per, cfg.Timeout))
	}
	if cfg.DatabaseURL != "" {
		l, err := OpenLedger(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, err
		}
		d.ledger = l
	}
	return d, nil
}

// Close releases connections.
func (d *Driver) Close() {
	for _, c := range d.clients {
		c.Close()
	}
	if d.ledger != nil {
		d.ledger.Close()
	}
}

// buyerState is what the buyers share while the drop runs.
type buyerState struct {
	rec       *recorder
	mu        sync.Mutex
	outcomes  map[string]int
	committed map[string]int
	unknown   map[string]int
	done      atomic.Int64
}

func (s *buyerState) outcome(name string) {
	s.mu.Lock()
	s.outcomes[name]++
	s.mu.Unlock()
}

// Run performs one drop: set up the SKU, let every buyer try, wait for the
// write-behind to drain, and judge. An error means the drop could not be
// run or observed (target down, bad SKU); a drop that ran but broke a
// promise returns a Result whose Verdict is not OK.
func (d *Driver) Run(ctx context.Context) (*Result, error) {
	cfg := d.cfg
	main := d.clients[0]
	res := &Result{RunID: cfg.RunID, Targets: cfg.Targets, Buyers: cfg.Buyers, Concurrency: cfg.Concurrency, Quantity: cfg.Quantity}

	sku, err := d.prepareSKU(ctx)
	if err != nil {
		return nil, err
	}
	res.SKU = sku
	info, ok, err := main.Product(ctx, sku)
	if err != nil {
		return nil, fmt.Errorf("reading %s before the drop: %w", sku, err)
	}
	if !ok {
		return nil, fmt.Errorf("reading %s before the drop: no such product", sku)
	}
	res.Initial = info.Stock

	if cfg.QuietCommits > 0 {
		if res.QuietCommit, err = d.quietCommits(ctx); err != nil {
			return nil, err
		}
	}
	var w *watch
	if cfg.Watchers > 0 && cfg.FloorURL != "" && cfg.WatchTransport == TransportWS {
		// The floor first, its watchers closed before the server's connect.
		if res.FloorWatch, err = d.floorWatch(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.Watchers > 0 {
		if w, err = d.startWatch(ctx, sku); err != nil {
			return nil, err
		}
		defer w.close()
	}

	var baseline LedgerState
	var baseSales map[string]int
	if d.ledger != nil {
		b, err := d.ledger.Read(ctx, sku, nil)
		if err != nil {
			return nil, err
		}
		baseline, baseSales = b, b.Sales
		baseline.Sales = nil
	}

	st := &buyerState{
		rec:      &recorder{start: time.Now()},
		outcomes: map[string]int{}, committed: map[string]int{}, unknown: map[string]int{},
	}
	res.StartedAt = st.rec.start
	// No-op requests on the quiet commits' server through the storm, the
	// floor the storm's commits are set beside.
	stopNoOps := res.QuietCommit.stormNoOps(ctx, main)

	// The sampler watches the live stock (and drives the progress bar)
	// until the buyers are done.
	samples := []StockSample{{T: 0, Stock: res.Initial}}
	samplerDone := make(chan struct{})
	stopSampler := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if info, ok, err := main.Product(ctx, sku); err == nil && ok {
				samples = append(samples, StockSample{T: time.Since(st.rec.start).Seconds(), Stock: info.Stock})
			}
			if cfg.Progress != nil {
				var last Stock
				if len(samples) > 0 {
					last = samples[len(samples)-1].Stock
				}
				cfg.Progress.Update(ProgressState{Done: int(st.done.Load()), Total: cfg.Buyers,
					Elapsed: time.Since(st.rec.start), Stock: last})
			}
			select {
			case <-stopSampler:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// Buyers start until Duration is up; once started, a buyer finishes
	// its checkout (bounded by its retries) so the verdict is not muddied
	// by holds the driver itself cut short.
	startCtx, cancelStart := context.WithTimeout(ctx, cfg.Duration)
	defer cancelStart()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(cfg.Concurrency, cfg.Buyers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for startCtx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= cfg.Buyers {
					return
				}
				d.buy(ctx, st, sku, i)
				st.done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(st.rec.start)
	stopNoOps()
	close(stopSampler)
	<-samplerDone
	if n := cfg.Buyers - int(st.done.Load()); n > 0 {
		st.outcomes[BuyerNotStarted] = n
	}
	if cfg.Progress != nil {
		var last Stock
		if len(samples) > 0 {
			last = samples[len(samples)-1].Stock
		}
		cfg.Progress.Update(ProgressState{Done: int(st.done.Load()), Total: cfg.Buyers, Elapsed: elapsed, Stock: last})
		cfg.Progress.Finish()
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("drop interrupted: %w", ctx.Err())
	}

	res.ElapsedSeconds = elapsed.Seconds()
	res.Samples = st.rec.snapshot()
	res.Ops = Summarise(res.Samples, elapsed)
	res.QuietCommit.compareStorm(res.Ops, machine.LoadAverage())
	res.BuyerOutcomes = st.outcomes

	drainStart := time.Now()
	final, ledger, settled, err := d.drain(ctx, sku, baseSales)
	if err != nil {
		return nil, err
	}
	res.DrainSeconds = time.Since(drainStart).Seconds()
	res.Final = final
	res.Ledger = ledger
	res.Stock = append(samples, StockSample{T: time.Since(st.rec.start).Seconds(), Stock: final})
	res.Verdict = Judge(VerdictInput{
		Observed: Observed{Committed: st.committed, Unknown: st.unknown, Samples: res.Stock},
		API:      final, Ledger: ledger, Baseline: baseline, Settled: settled,
	})
	if w != nil {
		wr, err := w.finish(ctx, final)
		if err != nil {
			return nil, err
		}
		res.Watch = &wr
		res.FloorWatch.compareFloor(wr)
		res.Verdict.Checks = append(res.Verdict.Checks, JudgeWatch(wr, cfg.WatchP99, cfg.WatchRSSKiB)...)
		res.Verdict.OK = len(res.Verdict.Failed()) == 0
	}
	if cfg.Waiters > 0 {
		wl, err := d.RunWaitlist(ctx)
		if err != nil {
			return nil, fmt.Errorf("waitlist rehearsal: %w", err)
		}
		res.Waitlist = wl
		res.Verdict.Checks = append(res.Verdict.Checks, wl.Checks...)
		res.Verdict.OK = len(res.Verdict.Failed()) == 0
	}
	if cfg.Mode == ModeDraw {
		dr, err := d.RunDraw(ctx)
		if err != nil {
			return nil, fmt.Errorf("draw rehearsal: %w", err)
		}
		res.Draw = dr
		res.Verdict.Checks = append(res.Verdict.Checks, dr.Checks...)
		res.Verdict.OK = len(res.Verdict.Failed()) == 0
	}
	if cfg.Mode == ModeQueue {
		qr, err := d.RunQueue(ctx)
		if err != nil {
			return nil, fmt.Errorf("queue rehearsal: %w", err)
		}
		res.Queue = qr
		res.Verdict.Checks = append(res.Verdict.Checks, qr.Checks...)
		res.Verdict.OK = len(res.Verdict.Failed()) == 0
	}
	return res, nil
}

// prepareSKU creates the drop's SKU, or checks the one given exists.
func (d *Driver) prepareSKU(ctx context.Context) (string, error) {
	cfg := d.cfg
	if cfg.SKU != "" {
		return cfg.SKU, nil
	}
	sku := "FLASH-" + cfg.RunID
	admin, err := d.issuer.Mint("flashsale-admin", true, time.Hour)
	if err != nil {
		return "", err
	}
	ue, err := d.clients[0].CreateProduct(ctx, admin, ProductInput{
		SKU: sku, Name: "flashsale drop " + cfg.RunID, Stock: cfg.Stock, MaxPerUser: cfg.MaxPerUser,
	})
	if err != nil {
		return "", fmt.Errorf("creating %s on %s: %w", sku, d.clients[0].Endpoint, err)
	}
	if ue != nil {
		return "", fmt.Errorf("creating %s: %s: %s", sku, ue.Code, ue.Message)
	}
	return sku, nil
}

// buy is one buyer's whole visit: reserve (retrying an unknown outcome with
// the same idempotency key), then after a short think commit, cancel or
// walk away.
func (d *Driver) buy(ctx context.Context, st *buyerState, sku string, i int) {
	cfg := d.cfg
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))) //nolint:gosec // repeatable choices, not secrets
	principal := "fs-" + cfg.RunID + "-" + strconv.Itoa(i)
	bearer, err := d.issuer.Mint(principal, false, cfg.Duration+cfg.Hold+time.Hour)
	if err != nil {
		st.outcome("token: " + err.Error())
		return
	}
	c := d.clients[i%len(d.clients)]
	in := ReserveInput{SKU: sku, Quantity: cfg.Quantity, IdempotencyKey: "flashsale-" + cfg.RunID + "-" + strconv.Itoa(i),
		HoldSeconds: int(cfg.Hold / time.Second)}

	var hold Reservation
	code := d.attempt(ctx, st, OpReserve, func() (*UserError, error) {
		r, ue, err := c.Reserve(ctx, bearer, in)
		hold = r
		return ue, err
	})
	if code != CodeOK {
		st.outcome("reserve refused: " + code)
		return
	}

	choice := rng.Float64()
	if cfg.Think > 0 {
		sleep(ctx, time.Duration(rng.Int64N(int64(cfg.Think))))
	}
	switch {
	case choice < cfg.CommitRatio:
		tries := 0
		code := d.attempt(ctx, st, OpCommit, func() (*UserError, error) {
			tries++
			_, ue, err := c.Commit(ctx, bearer, hold.Token)
			// Our own earlier attempt may have committed before its answer
			// was lost: the replay says so.
			if ue != nil && ue.Code == "ALREADY_COMMITTED" && tries > 1 {
				return nil, nil
			}
			return ue, err
		})
		st.mu.Lock()
		defer st.mu.Unlock()
		switch {
		case code == CodeOK:
			st.committed[hold.Token] = hold.Quantity
			st.outcomes[BuyerCommitted]++
		case retryable(code):
			st.unknown[hold.Token] = hold.Quantity
			st.outcomes[BuyerCommitUnknown]++
		default:
			st.outcomes["commit refused: "+code]++
		}
	case choice < cfg.CommitRatio+cfg.CancelRatio:
		code := d.attempt(ctx, st, OpCancel, func() (*UserError, error) {
			_, ue, err := c.Cancel(ctx, bearer, hold.Token)
			return ue, err
		})
		if code == CodeOK || code == "ALREADY_CANCELLED" {
			st.outcome(BuyerCancelled)
		} else {
			st.outcome("cancel failed: " + code)
		}
	default:
		st.outcome(BuyerAbandoned)
	}
}

// attempt sends a request until it has a definite outcome or the retries
// are spent, recording every try; it returns the last outcome code.
func (d *Driver) attempt(ctx context.Context, st *buyerState, op string, call func() (*UserError, error)) string {
	var code string
	for try := 0; ; try++ {
		t0 := time.Now()
		ue, err := call()
		code = codeOf(ue, err)
		st.rec.add(op, t0, code)
		if !retryable(code) || try >= d.cfg.Retries || ctx.Err() != nil {
			return code
		}
		wait := min(50*time.Millisecond<<try, time.Second)
		if ue != nil && ue.RetryAfterSeconds != nil {
			wait = min(time.Duration(*ue.RetryAfterSeconds)*time.Second, 2*time.Second)
		}
		sleep(ctx, wait/2+time.Duration(rand.Int64N(int64(wait/2)+1))) //nolint:gosec // jitter, not a secret
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// drain waits until the write-behind has caught up: two ledger readings in
// a row are identical and agree with the live stock, which itself did not
// move while the ledger was read. Without a ledger it waits for the live
// stock to stop moving. settled is false when the deadline came first; the
// last readings are returned either way.
func (d *Driver) drain(ctx context.Context, sku string, baseSales map[string]int) (api Stock, ledger *LedgerState, settled bool, err error) {
	deadline := time.Now().Add(d.cfg.DrainTimeout)
	main := d.clients[0]
	read := func() (Stock, error) {
		info, ok, err := main.Product(ctx, sku)
		if err == nil && !ok {
			err = fmt.Errorf("%s vanished", sku)
		}
		return info.Stock, err
	}
	var prev *LedgerState
	var prevAPI *Stock
	for {
		before, err := read()
		if err != nil {
			return Stock{}, nil, false, fmt.Errorf("reading stock after the drop: %w", err)
		}
		if d.ledger == nil {
			if prevAPI != nil && *prevAPI == before {
				return before, nil, true, nil
			}
			prevAPI = &before
		} else {
			l, err := d.ledger.Read(ctx, sku, baseSales)
			if err != nil {
				return Stock{}, nil, false, err
			}
			after, err := read()
			if err != nil {
				return Stock{}, nil, false, fmt.Errorf("reading stock after the drop: %w", err)
			}
			api, ledger = after, &l
			if before == after && agrees(after, l) && prev != nil && sameLedger(*prev, l) {
				return api, ledger, true, nil
			}
			prev = &l
		}
		if time.Now().After(deadline) {
			if d.ledger == nil {
				return before, nil, false, nil
			}
			return api, ledger, false, nil
		}
		sleep(ctx, 250*time.Millisecond)
		if ctx.Err() != nil {
			return Stock{}, nil, false, ctx.Err()
		}
	}
}
