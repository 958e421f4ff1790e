package flashsale

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// MaxWaiters bounds the waitlist rehearsal's queue (the server's default
// bound is 10,000 waiters per SKU).
const MaxWaiters = 10_000

// WaitlistResult is what the waitlist rehearsal (--waitlist) measured: a
// sold-out SKU of Stock units, Waiters buyers queued for it, then every
// holder cancelling while Outsiders try to reserve.
type WaitlistResult struct {
	SKU       string `json:"sku"`
	Holders   int    `json:"holders"`
	Waiters   int    `json:"waiters"`
	Outsiders int    `json:"outsiders"`
	// OutsidersServed is how many outsiders got a unit; with at least as
	// many waiters as units it must be 0.
	OutsidersServed int `json:"outsidersServed"`
	Offered         int `json:"offered"`
	Waiting         int `json:"waiting"`
	// CancelSeconds is how long the cancels and the outsiders' reserves
	// took, all in flight together.
	CancelSeconds float64   `json:"cancelSeconds"`
	JoinP99ms     float64   `json:"joinP99ms"`
	Final         Stock     `json:"finalStock"`
	LedgerChecked bool      `json:"ledgerChecked"`
	Checks        []Check   `json:"checks"`
	StartedAt     time.Time `json:"startedAt"`
}

const (
	joinDoc = `mutation Join($input: JoinWaitlistInput!) { joinWaitlist(input: $input) {
  entry { sku quantity position status reservation { token status quantity } }
  userErrors { code field message retryAfterSeconds } } }`
	myWaitlistDoc = `query Mine { myWaitlist { sku quantity position status reservation { token status quantity } } }`
)

// WaitlistEntry is the schema's WaitlistEntry as the rehearsal reads it.
type WaitlistEntry struct {
	SKU         string       `json:"sku"`
	Quantity    int          `json:"quantity"`
	Position    *int         `json:"position"`
	Status      string       `json:"status"`
	Reservation *Reservation `json:"reservation"`
}

// JoinWaitlist queues the bearer for units of sku.
func (c *Client) JoinWaitlist(ctx context.Context, bearer, sku string, quantity, holdSeconds int) (WaitlistEntry, *UserError, error) {
	var out struct {
		JoinWaitlist struct {
			Entry      *WaitlistEntry `json:"entry"`
			UserErrors []UserError    `json:"userErrors"`
		} `json:"joinWaitlist"`
	}
	in := map[string]any{"sku": sku, "quantity": quantity, "holdSeconds": holdSeconds}
	if err := c.do(ctx, bearer, joinDoc, map[string]any{"input": in}, &out); err != nil {
		return WaitlistEntry{}, nil, err
	}
	if ue := out.JoinWaitlist.UserErrors; len(ue) > 0 {
		return WaitlistEntry{}, &ue[0], nil
	}
	if out.JoinWaitlist.Entry == nil {
		return WaitlistEntry{}, nil, &CallError{Code: CodeBadReply, Err: errors.New("joinWaitlist: neither entry nor userErrors")}
	}
	return *out.JoinWaitlist.Entry, nil, nil
}

// MyWaitlist lists the bearer's waitlist entries.
func (c *Client) MyWaitlist(ctx context.Context, bearer string) ([]WaitlistEntry, error) {
	var out struct {
		MyWaitlist []WaitlistEntry `json:"myWaitlist"`
	}
	if err := c.do(ctx, bearer, myWaitlistDoc, nil, &out); err != nil {
		return nil, err
	}
	return out.MyWaitlist, nil
}

// parallel runs fn(i) for i in [0, n) on at most conc goroutines, all
// started together, and returns the first error.
func parallel(n, conc int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conc)
	start := make(chan struct{})
	for w := 0; w < min(conc, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				i := int(next.Add(1)) - 1
				if i >= n || errs[w] != nil {
					return
				}
				errs[w] = fn(i)
			}
		}()
	}
	close(start)
	wg.Wait()
	return errors.Join(errs...)
}

// RunWaitlist rehearses the waitlist (G13 in docs/design.md) over GraphQL: a
// fresh SKU of Stock units is reserved whole by Stock holders, Waiters
// buyers join its waitlist, and then every holder cancels while Outsiders
// (min(Buyers, 2000)) try to reserve, all in flight together. The verdict:
// each waiter got a distinct place; no outsider got a unit while waiters
// could take it; the first min(Stock, Waiters) waiters in join order hold
// an offered HELD reservation each (distinct tokens), the others wait with
// their places moved up; the live stock is all held; and, with the ledger,
// Postgres has every entry with the status and token the API reported.
func (d *Driver) RunWaitlist(ctx context.Context) (*WaitlistResult, error) {
	cfg := d.cfg
	c := d.clients[0]
	client := func(i int) *Client { return d.clients[i%len(d.clients)] }
	res := &WaitlistResult{SKU: "WAIT-" + cfg.RunID, Holders: cfg.Stock, Waiters: cfg.Waiters,
		Outsiders: min(cfg.Buyers, 2000), StartedAt: time.Now()}
	admin, err := d.issuer.Mint("flashsale-admin", true, time.Hour)
	if err != nil {
		return nil, err
	}
	if ue, err := c.CreateProduct(ctx, admin, ProductInput{SKU: res.SKU, Name: "Waitlist rehearsal " + cfg.RunID, Stock: cfg.Stock}); err != nil || ue != nil {
		return nil, callFailed("creating "+res.SKU, ue, err)
	}
	token := func(kind string, i int) (string, error) {
		return d.issuer.Mint(fmt.Sprintf("%s-%s-%d", kind, cfg.RunID, i), false, time.Hour)
	}
	hold := int(cfg.Hold / time.Second)

	holds := make([]string, res.Holders)
	err = parallel(res.Holders, cfg.Concurrency, func(i int) error {
		b, err := token("wl-holder", i)
		if err != nil {
			return err
		}
		r, ue, err := client(i).Reserve(ctx, b, ReserveInput{SKU: res.SKU, Quantity: 1, HoldSeconds: hold})
		if err != nil || ue != nil {
			return callFailed(fmt.Sprintf("holder %d", i), ue, err)
		}
		holds[i] = r.Token
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("selling out %s: %w", res.SKU, err)
	}

	// Joins in flight together: with nobody leaving meanwhile, the
	// position a join answers is its place in the queue for good.
	joinedAt := make([]int, res.Waiters) // waiter -> position at joining
	joinMs := make([]float64, res.Waiters)
	err = parallel(res.Waiters, cfg.Concurrency, func(i int) error {
		b, err := token("wl-waiter", i)
		if err != nil {
			return err
		}
		t0 := time.Now()
		e, ue, err := client(i).JoinWaitlist(ctx, b, res.SKU, 1, hold)
		joinMs[i] = float64(time.Since(t0).Microseconds()) / 1000
		if err != nil || ue != nil {
			return callFailed(fmt.Sprintf("waiter %d", i), ue, err)
		}
		if e.Position != nil {
			joinedAt[i] = *e.Position
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("joining the waitlist of %s: %w", res.SKU, err)
	}
	sort.Float64s(joinMs)
	if n := len(joinMs); n > 0 {
		res.JoinP99ms = joinMs[min(n-1, n*99/100)]
	}

	var served atomic.Int64
	t0 := time.Now()
	err = parallel(res.Holders+res.Outsiders, cfg.Concurrency, func(i int) error {
		if i < res.Holders {
			b, err := token("wl-holder", i)
			if err != nil {
				return err
			}
			_, ue, err := client(i).Cancel(ctx, b, holds[i])
			if err != nil || ue != nil {
				return callFailed(fmt.Sprintf("cancel %d", i), ue, err)
			}
			return nil
		}
		b, err := token("wl-outsider", i)
		if err != nil {
			return err
		}
		_, ue, err := client(i).Reserve(ctx, b, ReserveInput{SKU: res.SKU, Quantity: 1, HoldSeconds: hold})
		switch {
		case err != nil:
			return fmt.Errorf("outsider %d: %w", i, err)
		case ue == nil:
			served.Add(1)
		case ue.Code != "OUT_OF_STOCK":
			return fmt.Errorf("outsider %d: %s", i, ue.Code)
		}
		return nil
	})
	res.CancelSeconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, fmt.Errorf("cancelling while outsiders reserve: %w", err)
	}
	res.OutsidersServed = int(served.Load())

	entries := make([]WaitlistEntry, res.Waiters)
	err = parallel(res.Waiters, cfg.Concurrency, func(i int) error {
		b, err := token("wl-waiter", i)
		if err != nil {
			return err
		}
		mine, err := client(i).MyWaitlist(ctx, b)
		if err != nil {
			return fmt.Errorf("waiter %d: %w", i, err)
		}
		for _, e := range mine {
			if e.SKU == res.SKU {
				entries[i] = e
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the waiters' entries: %w", err)
	}
	info, _, err := c.Product(ctx, res.SKU)
	if err != nil {
		return nil, err
	}
	res.Final = info.Stock
	var ledger map[string]ledgerEntry
	if d.ledger != nil {
		if ledger, err = d.waitlistLedger(ctx, res, entries); err != nil {
			return nil, err
		}
		res.LedgerChecked = true
	}
	res.Checks = JudgeWaitlist(res, joinedAt, entries, ledger)
	return res, nil
}

// callFailed says why a call the rehearsal needs did not succeed.
func callFailed(what string, ue *UserError, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %s: %s", what, ue.Code, ue.Message)
}

// ledgerEntry is a waitlist_entries row, keyed by principal.
type ledgerEntry struct{ Status, Token string }

// waitlistLedger waits until the ledger has every entry in the state the
// API reported (the write-behind lags), up to DrainTimeout, and returns
// what it last read.
func (d *Driver) waitlistLedger(ctx context.Context, res *WaitlistResult, api []WaitlistEntry) (map[string]ledgerEntry, error) {
	deadline := time.Now().Add(d.cfg.DrainTimeout)
	for {
		got := map[string]ledgerEntry{}
		rows, err := d.ledger.pool.Query(ctx, `SELECT principal, status, coalesce(token, '') FROM waitlist_entries WHERE sku = $1`, res.SKU)
		if err != nil {
			return nil, fmt.Errorf("reading the ledger's waitlist: %w", err)
		}
		for rows.Next() {
			var who string
			var e ledgerEntry
			if err := rows.Scan(&who, &e.Status, &e.Token); err != nil {
				rows.Close()
				return nil, err
			}
			got[who] = e
		}
		rows.Close()
		agree := len(got) == len(api)
		for i, e := range api {
			if l := got[fmt.Sprintf("wl-waiter-%s-%d", d.cfg.RunID, i)]; l.Status != e.Status || (e.Reservation != nil && l.Token != e.Reservation.Token) {
				agree = false
			}
		}
		if agree || time.Now().After(deadline) {
			return got, nil
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// JudgeWaitlist checks the waitlist rehearsal. joinedAt is each waiter's
// position when it joined, entries what each reads afterwards, ledger the
// ledger's rows by principal (nil: not checked).
func JudgeWaitlist(res *WaitlistResult, joinedAt []int, entries []WaitlistEntry, ledger map[string]ledgerEntry) []Check {
	var out []Check
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, Check{Name: "waitlist: " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	seen := map[int]bool{}
	for _, p := range joinedAt {
		if p >= 1 && p <= len(joinedAt) {
			seen[p] = true
		}
	}
	add("one place each", len(seen) == len(joinedAt), "%d waiters joined, %d distinct places 1..%d", len(joinedAt), len(seen), len(joinedAt))

	want := 0
	if res.Waiters < res.Holders {
		want = res.Holders - res.Waiters
	}
	add("nobody outside the queue served", res.OutsidersServed <= want,
		"%d of %d outsiders got a unit while %d waiters queued for %d freed units (at most %d may)",
		res.OutsidersServed, res.Outsiders, res.Waiters, res.Holders, want)

	offeredN := min(res.Holders, res.Waiters)
	var wrong []string
	tokens := map[string]bool{}
	for i, e := range entries {
		pos := joinedAt[i]
		switch {
		case pos <= offeredN:
			res.Offered++
			if e.Status != "OFFERED" || e.Reservation == nil || e.Reservation.Status != "HELD" || e.Reservation.Quantity != 1 || tokens[e.Reservation.Token] {
				wrong = append(wrong, fmt.Sprintf("waiter at place %d: %s", pos, e.Status))
			} else {
				tokens[e.Reservation.Token] = true
			}
		default:
			res.Waiting++
			if e.Status != "WAITING" || e.Position == nil || *e.Position != pos-offeredN {
				wrong = append(wrong, fmt.Sprintf("waiter at place %d: %s", pos, e.Status))
			}
		}
	}
	sort.Strings(wrong)
	add("freed units handed in join order, one waiter each", len(wrong) == 0,
		"the first %d places hold a HELD reservation each (%d distinct), the other %d wait moved up by %d%s",
		offeredN, len(tokens), res.Waiters-offeredN, offeredN, sample(wrong))
	add("live stock", res.Final.Held == res.Holders-want+res.OutsidersServed && res.Final.Available == want-res.OutsidersServed &&
		res.Final.Total == res.Holders, "available %d, held %d, sold %d of %d", res.Final.Available, res.Final.Held, res.Final.Sold, res.Final.Total)
	if ledger == nil {
		out = append(out, Check{Name: "waitlist: ledger", Skipped: true, OK: true, Detail: "not read (--no-ledger)"})
		return out
	}
	var missing []string
	for i, e := range entries {
		who := fmt.Sprintf("wl-waiter-%s-%d", res.SKU[len("WAIT-"):], i)
		l, ok := ledger[who]
		if !ok || l.Status != e.Status || (e.Reservation != nil && l.Token != e.Reservation.Token) {
			missing = append(missing, fmt.Sprintf("%s: API %s, ledger %q", who, e.Status, l.Status))
		}
	}
	sort.Strings(missing)
	add("ledger", len(missing) == 0 && len(ledger) == len(entries), "%d entries in Postgres for %d waiters, %d disagree with the API%s",
		len(ledger), len(entries), len(missing), sample(missing))
	return out
}
