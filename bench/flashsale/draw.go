package flashsale

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/drawverify"
)

// The rehearsals Mode names: the drop alone, or the drop followed by the
// draw rehearsal.
const (
	ModeDrop = "drop"
	ModeDraw = "draw"
)

// MaxEntrants bounds the draw rehearsal's entrants.
const MaxEntrants = 100_000

// MaxDrawWatchers bounds the entrants that watch their entry by a push.
const MaxDrawWatchers = 20_000

// DrawResult is what the draw rehearsal (--mode draw) measured: a SKU of
// Stock units sold by draw, Entrants buyers entering at once (every tenth
// twice), the draw run by the server at closesAt, and its outcome as every
// buyer and the ledger see it.
type DrawResult struct {
	SKU      string `json:"sku"`
	Stock    int    `json:"stock"`
	Entrants int    `json:"entrants"`
	// Replays is how many second entries were sent; ReplaysSame how many
	// answered the buyer's first entry.
	Replays     int `json:"replays"`
	ReplaysSame int `json:"replaysSame"`
	// Entries is the draw's own count; Winners, Losers and WonUnits are
	// what the buyers' myDrawEntries say.
	Entries  int `json:"entries"`
	Winners  int `json:"winners"`
	Losers   int `json:"losers"`
	WonUnits int `json:"wonUnits"`
	// EnterSeconds is how long the entries took, all in flight together;
	// DrawSeconds from closesAt until every buyer saw the result.
	EnterSeconds float64 `json:"enterSeconds"`
	DrawSeconds  float64 `json:"drawSeconds"`
	EnterP99ms   float64 `json:"enterP99ms"`
	// EntriesPerSecond is the first entries over EnterSeconds (each a
	// new row); RequestsPerSecond counts the second entries too (each
	// answered, none a new row).
	EntriesPerSecond  float64 `json:"entriesPerSecond"`
	RequestsPerSecond float64 `json:"requestsPerSecond"`
	// EntryCost is the CPU the entries cost each process, per first entry.
	EntryCost EntryCost `json:"entryCost"`
	// AppliedSeconds is from closesAt to the result applied (every winner's
	// hold in Redis, every loser queued) as the server recorded it
	// (Draw.appliedAt); AppliedSeenSeconds when this driver first read it.
	AppliedSeconds     float64 `json:"appliedSeconds"`
	AppliedSeenSeconds float64 `json:"appliedSeenSeconds"`
	// Watchers is how many entrants watched their entry with
	// myDrawEntryChanged; Told how many were pushed WON (with their hold)
	// or LOST, TellMismatch how many pushes disagreed with the entry read
	// after; PushP50Seconds and PushAllSeconds are from closesAt to the
	// median and the last watcher told.
	Watchers       int       `json:"watchers"`
	Told           int       `json:"told"`
	TellMismatch   int       `json:"tellMismatch"`
	PushP50Seconds float64   `json:"pushP50Seconds"`
	PushAllSeconds float64   `json:"pushAllSeconds"`
	WatchErrors    []string  `json:"watchErrors,omitempty"`
	Seed           string    `json:"seed"`
	SeedHash       string    `json:"seedHash"`
	Final          Stock     `json:"finalStock"`
	LedgerChecked  bool      `json:"ledgerChecked"`
	Verification   string    `json:"verification,omitempty"`
	Checks         []Check   `json:"checks"`
	StartedAt      time.Time `json:"startedAt"`
}

const (
	drawAppliedDoc = `query Applied($sku: ID!) { product(sku: $sku) { draw { appliedAt } } }`
	watchDrawDoc   = `subscription Mine($sku: ID!) { myDrawEntryChanged(sku: $sku) { status quantity place reservation { token status quantity } } }`
	enterDrawDoc   = `mutation Enter($input: EnterDrawInput!) { enterDraw(input: $input) {
  entry { sku quantity status enteredAt place reservation { token status quantity } }
  userErrors { code field message retryAfterSeconds } } }`
	myDrawEntriesDoc = `query Mine { myDrawEntries { sku quantity status enteredAt place reservation { token status quantity } } }`
	drawDoc          = `query Draw($sku: ID!) { product(sku: $sku) { stock { available held sold total } draw { status entries seedHash seed winners } } }`
	createDrawDoc    = `mutation Create($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code field message } } }`
)

// DrawEntry is the schema's DrawEntry as the rehearsal reads it.
type DrawEntry struct {
	SKU         string       `json:"sku"`
	Quantity    int          `json:"quantity"`
	Status      string       `json:"status"`
	EnteredAt   time.Time    `json:"enteredAt"`
	Place       *int         `json:"place"`
	Reservation *Reservation `json:"reservation"`
}

// DrawInfo is a product's draw and live stock as the rehearsal reads them.
type DrawInfo struct {
	Stock Stock `json:"stock"`
	Draw  *struct {
		Status   string  `json:"status"`
		Entries  int     `json:"entries"`
		SeedHash string  `json:"seedHash"`
		Seed     *string `json:"seed"`
		Winners  *int    `json:"winners"`
	} `json:"draw"`
}

// EnterDraw enters the bearer in sku's draw.
func (c *Client) EnterDraw(ctx context.Context, bearer, sku string, quantity int) (DrawEntry, *UserError, error) {
	var out struct {
		EnterDraw struct {
			Entry      *DrawEntry  `json:"entry"`
			UserErrors []UserError `json:"userErrors"`
		} `json:"enterDraw"`
	}
	if err := c.do(ctx, bearer, enterDrawDoc, map[string]any{"input": map[string]any{"sku": sku, "quantity": quantity}}, &out); err != nil {
		return DrawEntry{}, nil, err
	}
	if ue := out.EnterDraw.UserErrors; len(ue) > 0 {
		return DrawEntry{}, &ue[0], nil
	}
	if out.EnterDraw.Entry == nil {
		return DrawEntry{}, nil, &CallError{Code: CodeBadReply, Err: errors.New("enterDraw: neither entry nor userErrors")}
	}
	return *out.EnterDraw.Entry, nil, nil
}

// MyDrawEntries lists the bearer's draw entries.
func (c *Client) MyDrawEntries(ctx context.Context, bearer string) ([]DrawEntry, error) {
	var out struct {
		MyDrawEntries []DrawEntry `json:"myDrawEntries"`
	}
	if err := c.do(ctx, bearer, myDrawEntriesDoc, nil, &out); err != nil {
		return nil, err
	}
	return out.MyDrawEntries, nil
}

// Draw reads sku's draw and live stock.
func (c *Client) Draw(ctx context.Context, sku string) (DrawInfo, error) {
	var out struct {
		Product *DrawInfo `json:"product"`
	}
	if err := c.do(ctx, "", drawDoc, map[string]any{"sku": sku}, &out); err != nil {
		return DrawInfo{}, err
	}
	if out.Product == nil || out.Product.Draw == nil {
		return DrawInfo{}, fmt.Errorf("%s: no such product sold by draw", sku)
	}
	return *out.Product, nil
}

// entrantQuantity is what entrant i asks for: 1 or 2 units, so the fill
// has entries that do not fit what is left.
func entrantQuantity(i int) int { return 1 + i%2 }

// RunDraw rehearses a draw over GraphQL: a fresh SKU of Stock units sold by
// draw, closing DrawWindow after its creation; Entrants buyers enter at
// once, every tenth twice (the second must answer the first entry); after
// closesAt the server draws, and every buyer reads its entry until all are
// WON or LOST and the winners' reservations are there. JudgeDraw adds the
// checks; with the ledger, the draw is also recomputed from its revealed
// seed and its entries by the verification `dropline verify-draw` runs.
func (d *Driver) RunDraw(ctx context.Context) (*DrawResult, error) {
	cfg := d.cfg
	c := d.clients[0]
	client := func(i int) *Client { return d.clients[i%len(d.clients)] }
	res := &DrawResult{SKU: "DRAW-" + cfg.RunID, Stock: cfg.Stock, Entrants: cfg.Entrants, StartedAt: time.Now()}
	admin, err := d.issuer.Mint("flashsale-admin", true, time.Hour)
	if err != nil {
		return nil, err
	}
	closesAt := time.Now().Add(cfg.DrawWindow).Truncate(time.Second).Add(time.Second)
	hold := int(cfg.Hold / time.Second)
	var created struct {
		CreateProduct struct {
			UserErrors []UserError `json:"userErrors"`
		} `json:"createProduct"`
	}
	input := map[string]any{"sku": res.SKU, "name": "Draw rehearsal " + cfg.RunID, "stock": cfg.Stock,
		"price": map[string]any{"amount": 100, "currency": "EUR"},
		"draw":  map[string]any{"closesAt": closesAt.UTC().Format(time.RFC3339), "winnerHoldSeconds": hold}}
	if err := c.do(ctx, admin, createDrawDoc, map[string]any{"input": input}, &created); err != nil {
		return nil, fmt.Errorf("creating %s: %w", res.SKU, err)
	}
	if ue := created.CreateProduct.UserErrors; len(ue) > 0 {
		return nil, callFailed("creating "+res.SKU, &ue[0], nil)
	}
	// Each entrant's token is minted before the entries are timed, as a
	// real entrant comes signed in: the timed part is the requests alone.
	bearers := make([]string, res.Entrants)
	for i := range bearers {
		if bearers[i], err = d.issuer.Mint(fmt.Sprintf("draw-%s-%d", cfg.RunID, i), false, time.Hour); err != nil {
			return nil, err
		}
	}
	token := func(i int) (string, error) { return bearers[i], nil }

	// Every entrant enters; every tenth sends a second entry right away.
	firsts := make([]DrawEntry, res.Entrants)
	enterMs := make([]float64, res.Entrants)
	var replays, same atomic.Int64
	var rdb *redis.Client
	if cfg.RedisURL != "" {
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("--redis-url: %w", err)
		}
		rdb = redis.NewClient(opts)
		defer rdb.Close()
	}
	cost0 := d.readCost(ctx, rdb)
	t0 := time.Now()
	err = parallel(res.Entrants, cfg.Concurrency, func(i int) error {
		b, err := token(i)
		if err != nil {
			return err
		}
		t := time.Now()
		e, ue, err := client(i).EnterDraw(ctx, b, res.SKU, entrantQuantity(i))
		enterMs[i] = float64(time.Since(t).Microseconds()) / 1000
		if err != nil || ue != nil {
			return callFailed(fmt.Sprintf("entrant %d", i), ue, err)
		}
		firsts[i] = e
		if i%10 == 0 {
			again, ue, err := client(i+1).EnterDraw(ctx, b, res.SKU, entrantQuantity(i))
			if err != nil || ue != nil {
				return callFailed(fmt.Sprintf("entrant %d again", i), ue, err)
			}
			replays.Add(1)
			if again.EnteredAt.Equal(e.EnteredAt) && again.Quantity == e.Quantity {
				same.Add(1)
			}
		}
		return nil
	})
	res.EnterSeconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, fmt.Errorf("entering the draw of %s: %w", res.SKU, err)
	}
	res.Replays, res.ReplaysSame = int(replays.Load()), int(same.Load())
	res.EntryCost = entryCost(cost0, d.readCost(ctx, rdb), res.Entrants, res.Entrants+res.Replays, runtime.NumCPU())
	res.EnterP99ms = p99(enterMs)
	res.EntriesPerSecond = float64(res.Entrants) / res.EnterSeconds
	res.RequestsPerSecond = float64(res.Entrants+res.Replays) / res.EnterSeconds
	if time.Now().After(closesAt) {
		return nil, fmt.Errorf("the entries took %.1fs, past the draw's close: raise --draw-window", res.EnterSeconds)
	}
	watchers, err := d.watchDraw(ctx, res, token)
	if err != nil {
		return nil, err
	}
	defer watchers.close()
	if time.Now().After(closesAt) {
		return nil, fmt.Errorf("the entries and the watchers took past the draw's close: raise --draw-window")
	}
	if err := d.awaitApplied(ctx, res, closesAt); err != nil {
		return nil, err
	}
	watchers.wait(closesAt.Add(cfg.DrainTimeout))

	// The server draws at closesAt; every buyer reads its entry until the
	// result, winners' reservations included, has reached it.
	entries := make([]DrawEntry, res.Entrants)
	deadline := closesAt.Add(cfg.DrainTimeout)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		info, err := c.Draw(ctx, res.SKU)
		if err != nil {
			return nil, err
		}
		if info.Draw.Status == "DRAWN" {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s not drawn %s after closesAt", res.SKU, cfg.DrainTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		var pending atomic.Int64
		err = parallel(res.Entrants, cfg.Concurrency, func(i int) error {
			if e := entries[i]; e.Status == "LOST" || e.Status == "WON" && e.Reservation != nil {
				return nil
			}
			b, err := token(i)
			if err != nil {
				return err
			}
			mine, err := client(i).MyDrawEntries(ctx, b)
			if err != nil {
				return fmt.Errorf("entrant %d: %w", i, err)
			}
			for _, e := range mine {
				if e.SKU == res.SKU {
					entries[i] = e
				}
			}
			if e := entries[i]; e.Status != "LOST" && (e.Status != "WON" || e.Reservation == nil) {
				pending.Add(1)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading the entrants' entries: %w", err)
		}
		if pending.Load() == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.DrawSeconds = time.Since(closesAt).Seconds()
	watchers.judge(res, closesAt, entries)
	info, err := c.Draw(ctx, res.SKU)
	if err != nil {
		return nil, err
	}
	res.Final, res.Entries, res.SeedHash = info.Stock, info.Draw.Entries, info.Draw.SeedHash
	if info.Draw.Seed != nil {
		res.Seed = *info.Draw.Seed
	}
	var verifyErr error
	if d.ledger != nil {
		var out strings.Builder
		verifyErr = d.ledger.VerifyDraw(ctx, res.SKU, &out)
		res.Verification = strings.TrimSpace(out.String())
		res.LedgerChecked = true
	}
	res.Checks = JudgeDraw(res, firsts, entries, verifyErr)
	return res, nil
}

func p99(ms []float64) float64 {
	if len(ms) == 0 {
		return 0
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

// VerifyDraw recomputes sku's draw from the ledger with the verification
// `dropline verify-draw` runs (drawverify.Verify); its report goes to out.
// The winners may hold their reservations a moment before the server has
// recorded the draw as applied (the last step of carrying it to them), so it
// waits for that first, up to 10 seconds.
func (r *LedgerReader) VerifyDraw(ctx context.Context, sku string, out *strings.Builder) error {
	l := db.NewLedger(r.pool)
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, err := l.Draws().Draw(ctx, sku)
		if err != nil {
			return fmt.Errorf("reading the draw of %s: %w", sku, err)
		}
		if d.AppliedAt != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return drawverify.Verify(ctx, out, l, sku)
}

// JudgeDraw checks a draw rehearsal: one entry per buyer (replays answer
// the first), every buyer WON or LOST, the stock filled as far as the
// entries fit (the winners' units are the stock, or no loser's quantity
// fits what is left), every winner holding a HELD reservation of its
// quantity (distinct tokens, the stock's held units exactly theirs), the
// revealed seed hashing to the published seedHash, and, with the ledger,
// the recomputed draw equal to the recorded one (verifyErr).
func JudgeDraw(res *DrawResult, firsts, entries []DrawEntry, verifyErr error) []Check {
	var checks []Check
	add := func(name string, ok bool, format string, args ...any) {
		checks = append(checks, Check{Name: "draw: " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	res.Winners, res.Losers, res.WonUnits = 0, 0, 0
	undecided, smallestLoser := 0, 0
	tokens := map[string]bool{}
	badHolds := 0
	for _, e := range entries {
		switch e.Status {
		case "WON":
			res.Winners++
			res.WonUnits += e.Quantity
			r := e.Reservation
			if r == nil || r.Status != "HELD" || r.Quantity != e.Quantity || r.Token == "" || tokens[r.Token] {
				badHolds++
			} else {
				tokens[r.Token] = true
			}
		case "LOST":
			res.Losers++
			if smallestLoser == 0 || e.Quantity < smallestLoser {
				smallestLoser = e.Quantity
			}
		default:
			undecided++
		}
	}
	entered := 0
	for i, e := range firsts {
		if e.Status == "ENTERED" && e.Quantity == entrantQuantity(i) {
			entered++
		}
	}
	add("one entry per buyer", res.Entries == res.Entrants && entered == res.Entrants && res.ReplaysSame == res.Replays,
		"the draw counts %d entries for %d buyers, %d entered as asked; %d of %d second entries answered the first",
		res.Entries, res.Entrants, entered, res.ReplaysSame, res.Replays)
	add("every buyer WON or LOST", undecided == 0 && res.Winners+res.Losers == res.Entrants,
		"%d won, %d lost, %d neither", res.Winners, res.Losers, undecided)
	left := res.Stock - res.WonUnits
	filled := left >= 0 && (left == 0 || smallestLoser == 0 || smallestLoser > left)
	add("stock filled as far as the entries fit", filled,
		"winners' units %d of %d; %d left, smallest losing quantity %d", res.WonUnits, res.Stock, left, smallestLoser)
	add("winners hold HELD reservations", badHolds == 0 && res.Final.Held == res.WonUnits,
		"%d of %d winners hold a HELD reservation of their quantity (distinct tokens); the stock holds %d units for %d won",
		res.Winners-badHolds, res.Winners, res.Final.Held, res.WonUnits)
	seed, err := hex.DecodeString(res.Seed)
	sum := sha256.Sum256(seed)
	add("the revealed seed hashes to seedHash", err == nil && len(seed) == 32 && hex.EncodeToString(sum[:]) == res.SeedHash,
		"seed %s, seedHash %s", res.Seed, res.SeedHash)
	add("every watcher told its result by a push", res.Told == res.Watchers && res.TellMismatch == 0,
		"%d of %d watchers pushed WON (with their hold) or LOST, %d disagreeing with their entry; the last %.2fs after closesAt",
		res.Told, res.Watchers, res.TellMismatch, res.PushAllSeconds)
	if !res.LedgerChecked {
		checks = append(checks, Check{Name: "draw: recomputed draw equals the published one", Skipped: true, Detail: "ledger not read (--no-ledger)"})
	} else {
		detail := res.Verification
		if verifyErr != nil {
			detail = verifyErr.Error() + "; " + detail
		}
		add("recomputed draw equals the published one", verifyErr == nil, "%s", detail)
	}
	return checks
}
