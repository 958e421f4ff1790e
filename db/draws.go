package db

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statuses of a draw and of its entries.
const (
	DrawOpen  = "OPEN"
	DrawDrawn = "DRAWN"

	EntryEntered = "ENTERED"
	EntryWon     = "WON"
	EntryLost    = "LOST"
)

// NewDraw is the draw of a product being created.
type NewDraw struct {
	ClosesAt   time.Time
	WinnerHold time.Duration
	// Seed is the draw's 32 random bytes; its SHA-256 is published at once.
	Seed []byte
}

// Draw is one row of draws, with its number of entries.
type Draw struct {
	SKU              string
	ClosesAt         time.Time
	WinnerHoldMillis int64
	// Seed is nil until the draw is DRAWN: it is revealed only then.
	Seed     []byte
	SeedHash string
	Status   string
	// Stock is the units the draw gave out (total less sold and held when it ran);
	// Entries and Winners are counted when it ran (Entries live until then).
	Stock, Entries, Winners int
	DrawnAt, AppliedAt      *time.Time
}

// DrawEntry is one row of draw_entries.
type DrawEntry struct {
	ID        int64
	SKU       string
	Principal string
	Quantity  int
	EnteredAt time.Time
	Status    string
	// Place is the entry's position in the shuffled order, from 1; 0 until
	// the draw.
	Place int
	// Token names a winner's HELD reservation; "" otherwise.
	Token string
}

// DrawClosedError says an entry came outside the draw's window.
type DrawClosedError struct {
	StartsAt *time.Time
	ClosesAt time.Time
}

func (e *DrawClosedError) Error() string { return "the draw is not taking entries" }

// DrawQuotaError says an entry asked for more than the per-principal limit.
type DrawQuotaError struct{ Limit int }

func (e *DrawQuotaError) Error() string {
	return fmt.Sprintf("an entry may ask for at most %d units", e.Limit)
}

// SeedHash is the published commitment to a draw's seed: hex SHA-256.
func SeedHash(seed []byte) string {
	h := sha256.Sum256(seed)
	return hex.EncodeToString(h[:])
}

func insertDraw(ctx context.Context, tx pgx.Tx, sku string, d NewDraw) error {
	if len(d.Seed) != 32 {
		return fmt.Errorf("draw of %s: %w: the seed must be 32 bytes", sku, ErrInvalid)
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO draws (sku, closes_at, winner_hold_ms, seed, seed_hash) VALUES ($1, $2, $3, $4, $5)`,
		sku, d.ClosesAt, d.WinnerHold.Milliseconds(), d.Seed, SeedHash(d.Seed))
	return interpret(err)
}

const drawColumns = `d.sku, d.closes_at, d.winner_hold_ms, CASE WHEN d.status = 'DRAWN' THEN d.seed END, d.seed_hash, d.status,
	coalesce(d.stock, 0), coalesce(d.entries, (SELECT count(*) FROM draw_entries e WHERE e.sku = d.sku)), coalesce(d.winners, 0),
	d.drawn_at, d.applied_at`

func scanDraw(row pgx.Row) (Draw, error) {
	var d Draw
	err := row.Scan(&d.SKU, &d.ClosesAt, &d.WinnerHoldMillis, &d.Seed, &d.SeedHash, &d.Status,
		&d.Stock, &d.Entries, &d.Winners, &d.DrawnAt, &d.AppliedAt)
	return d, interpret(err)
}

// entryColumns read an entry with its result: entryFrom is the join.
const entryColumns = `e.id, e.sku, e.principal, e.quantity, e.entered_at,
	CASE WHEN r.won THEN 'WON' WHEN NOT r.won THEN 'LOST' ELSE 'ENTERED' END, coalesce(r.place, 0), coalesce(r.token, '')`

const entryFrom = ` FROM draw_entries e LEFT JOIN draw_results r ON r.entry_id = e.id `

func scanEntry(row pgx.Row) (DrawEntry, error) {
	var e DrawEntry
	err := row.Scan(&e.ID, &e.SKU, &e.Principal, &e.Quantity, &e.EnteredAt, &e.Status, &e.Place, &e.Token)
	return e, interpret(err)
}

func collectEntries(rows pgx.Rows, err error) ([]DrawEntry, error) {
	if err != nil {
		return nil, interpret(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DrawEntry, error) { return scanEntry(r) })
	return out, interpret(err)
}

// Draw returns a product's draw; ErrNotFound when the product has none.
func (ds Draws) Draw(ctx context.Context, sku string) (Draw, error) {
	return scanDraw(ds.l.pool.QueryRow(ctx, `SELECT `+drawColumns+` FROM draws d WHERE d.sku = $1`, sku))
}

// DrawsBySKU returns the draws of several products in one statement; a
// product sold first come, first served (or unknown) has no entry. It
// exists for per-request batching.
func (ds Draws) DrawsBySKU(ctx context.Context, skus []string) ([]Draw, error) {
	rows, err := ds.l.pool.Query(ctx, `SELECT `+drawColumns+` FROM draws d WHERE d.sku = ANY($1)`, skus)
	if err != nil {
		return nil, fmt.Errorf("reading draws: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Draw, error) { return scanDraw(r) })
	if err != nil {
		return nil, fmt.Errorf("reading draws: %w", err)
	}
	return out, nil
}

// EnterDraw records a principal's entry in a SKU's draw, or returns the
// entry it has (replayed true; the quantity asked this time is ignored).
// It is EnterDraws of one request. Refusals: ErrNotFound, *DrawClosedError,
// *DrawQuotaError.
func (ds Draws) EnterDraw(ctx context.Context, sku, principal string, quantity int) (e DrawEntry, replayed bool, err error) {
	out, err := ds.EnterDraws(ctx, []DrawEntryRequest{{SKU: sku, Principal: principal, Quantity: quantity}})
	if err != nil {
		return DrawEntry{}, false, err
	}
	return out[0].Entry, out[0].Replayed, out[0].Err
}

// DrawEntryRequest is one principal's entry asked of EnterDraws.
type DrawEntryRequest struct {
	SKU, Principal string
	Quantity       int
}

// DrawEntryAnswer is EnterDraws' answer to one request: its entry (Replayed
// when the principal had it already, the quantity asked this time ignored),
// or its refusal in Err: ErrNotFound, *DrawClosedError, *DrawQuotaError.
type DrawEntryAnswer struct {
	Entry    DrawEntry
	Replayed bool
	Err      error
}

// drawWindow is a draw's row as an entry checks it.
type drawWindow struct {
	status string
	closes time.Time
	starts *time.Time
	max    int
	open   bool
}

// EnterDraws records many entries in one transaction: group commit, so that
// an entry is a Postgres row before its answer without a transaction (and a
// WAL flush) of its own. Each request is decided as EnterDraw decides it
// alone, in the order given: a principal's entry found (in the ledger, or
// made by an earlier request of the batch) is returned; else the window is
// checked on Postgres' clock under a share lock of the draw's row, which
// the draw takes exclusively, so an entry accepted is in the draw; then the
// per-principal limit. The error returned is the transaction's (every
// request failed); refusals are per answer.
func (ds Draws) EnterDraws(ctx context.Context, reqs []DrawEntryRequest) ([]DrawEntryAnswer, error) {
	var out []DrawEntryAnswer
	err := ds.l.inTx(ctx, "enter_draws", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		out = make([]DrawEntryAnswer, len(reqs))
		skus := make([]string, 0, 1)
		seen := map[string]bool{}
		for _, r := range reqs {
			if !seen[r.SKU] {
				seen[r.SKU] = true
				skus = append(skus, r.SKU)
			}
		}
		slices.Sort(skus)
		rows, err := tx.Query(ctx, `
			SELECT d.sku, d.status, d.closes_at, p.sale_starts_at, coalesce(p.max_per_user, 0),
			       (p.sale_starts_at IS NULL OR p.sale_starts_at <= clock_timestamp()) AND clock_timestamp() < d.closes_at
			FROM draws d JOIN products p ON p.sku = d.sku WHERE d.sku = ANY($1) ORDER BY d.sku FOR SHARE OF d`, skus)
		if err != nil {
			return interpret(err)
		}
		windows := map[string]drawWindow{}
		var (
			sku string
			w   drawWindow
		)
		if _, err := pgx.ForEachRow(rows, []any{&sku, &w.status, &w.closes, &w.starts, &w.max, &w.open}, func() error {
			windows[sku] = w
			return nil
		}); err != nil {
			return interpret(err)
		}
		key := func(sku, principal string) string { return sku + "\x00" + principal }
		found, err := ds.entriesOf(ctx, tx, reqs, windows)
		if err != nil {
			return err
		}
		// Decide each request in order; the first of a principal that may
		// enter makes the entry, which later ones of the batch replay.
		first := map[string]int{}
		var fresh []int
		for i, r := range reqs {
			w, ok := windows[r.SKU]
			k := key(r.SKU, r.Principal)
			switch e, has := found[k]; {
			case !ok:
				out[i].Err = ErrNotFound
			case has:
				out[i].Entry, out[i].Replayed = e, true
			case first[k] > 0:
				out[i].Replayed = true // filled in once the entry is made
			case w.status != DrawOpen || !w.open:
				out[i].Err = &DrawClosedError{StartsAt: w.starts, ClosesAt: w.closes}
			case w.max > 0 && r.Quantity > w.max:
				out[i].Err = &DrawQuotaError{Limit: w.max}
			default:
				first[k] = i + 1
				fresh = append(fresh, i)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		// Inserted in (sku, principal) order, so that two batches that meet
		// on the same principals wait for each other in one order, never in
		// a cycle. An entry a concurrent batch made first is waited for
		// (ON CONFLICT), not inserted, and read after: a replay.
		slices.SortFunc(fresh, func(a, b int) int {
			return cmp.Or(cmp.Compare(reqs[a].SKU, reqs[b].SKU), cmp.Compare(reqs[a].Principal, reqs[b].Principal))
		})
		sk, pr, qt := make([]string, len(fresh)), make([]string, len(fresh)), make([]int32, len(fresh))
		for j, i := range fresh {
			sk[j], pr[j], qt[j] = reqs[i].SKU, reqs[i].Principal, int32(reqs[i].Quantity)
		}
		made, err := collectEntries(tx.Query(ctx, `
			INSERT INTO draw_entries (sku, principal, quantity)
			SELECT v.sku, v.principal, v.quantity FROM unnest($1::text[], $2::text[], $3::int[]) WITH ORDINALITY AS v(sku, principal, quantity, n) ORDER BY v.n
			ON CONFLICT (sku, principal) DO NOTHING RETURNING id, sku, principal, quantity, entered_at, 'ENTERED', 0, ''`,
			sk, pr, qt))
		if err != nil {
			return err
		}
		entries := make(map[string]DrawEntry, len(fresh))
		mine := make(map[int64]bool, len(made))
		for _, e := range made {
			entries[key(e.SKU, e.Principal)] = e
			mine[e.ID] = true
		}
		if len(made) < len(fresh) {
			var late []DrawEntryRequest
			for _, i := range fresh {
				if _, ok := entries[key(reqs[i].SKU, reqs[i].Principal)]; !ok {
					late = append(late, reqs[i])
				}
			}
			again, err := ds.entriesOf(ctx, tx, late, windows)
			if err != nil {
				return err
			}
			for k, e := range again {
				entries[k] = e
			}
		}
		for i, r := range reqs {
			k := key(r.SKU, r.Principal)
			if out[i].Err != nil || out[i].Entry.ID != 0 {
				continue
			}
			e, ok := entries[k]
			if !ok {
				return fmt.Errorf("entering the draw of %s: the entry of %s was neither made nor found", r.SKU, r.Principal)
			}
			out[i].Entry = e
			// Made by a concurrent batch first: this request replays it.
			out[i].Replayed = out[i].Replayed || !mine[e.ID]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// entriesOf reads the entries the principals of reqs have in the draws of
// windows, by sku and principal: one statement per draw (a batch is
// nearly always of one), each principal one probe of the (sku, principal)
// key and one of the result by entry id. The statement is written so that
// its plan cannot be anything else: each connection keeps one plan, made
// when draw_entries may still be empty and never analyzed, and a plan
// chosen for an empty table (a hash join against a scan of the table, or
// an index scan on the sku alone) costs each batch a pass over every entry
// of the draw so far once the table has grown.
func (ds Draws) entriesOf(ctx context.Context, tx pgx.Tx, reqs []DrawEntryRequest, windows map[string]drawWindow) (map[string]DrawEntry, error) {
	bySKU := map[string][]string{}
	for _, r := range reqs {
		if _, ok := windows[r.SKU]; ok {
			bySKU[r.SKU] = append(bySKU[r.SKU], r.Principal)
		}
	}
	out := map[string]DrawEntry{}
	for sku, principals := range bySKU {
		list, err := collectEntries(tx.Query(ctx, `SELECT `+entryColumns+` FROM unnest($2::text[]) AS k(principal)
			CROSS JOIN LATERAL (SELECT * FROM draw_entries e WHERE e.sku = $1 AND e.principal = k.principal LIMIT 1) e
			LEFT JOIN LATERAL (SELECT won, place, token FROM draw_results r WHERE r.entry_id = e.id LIMIT 1) r ON true`,
			sku, principals))
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			out[e.SKU+"\x00"+e.Principal] = e
		}
	}
	return out, nil
}

// DrawEntriesOf lists a principal's entries, newest first, at most limit.
func (ds Draws) DrawEntriesOf(ctx context.Context, principal string, limit int) ([]DrawEntry, error) {
	return collectEntries(ds.l.pool.Query(ctx, `SELECT `+entryColumns+entryFrom+`
		WHERE e.principal = $1 ORDER BY e.entered_at DESC, e.id DESC LIMIT $2`, principal, limit))
}

// DrawEntryOf returns a principal's entry in a SKU's draw; ErrNotFound
// when it has none.
func (ds Draws) DrawEntryOf(ctx context.Context, sku, principal string) (DrawEntry, error) {
	return scanEntry(ds.l.pool.QueryRow(ctx, `SELECT `+entryColumns+entryFrom+`WHERE e.sku = $1 AND e.principal = $2`, sku, principal))
}

// DrawEntries returns every entry of a SKU's draw by id: what the shuffle
// starts from, and what a verifier reads.
func (ds Draws) DrawEntries(ctx context.Context, sku string) ([]DrawEntry, error) {
	return collectEntries(ds.l.pool.Query(ctx, `SELECT `+entryColumns+entryFrom+`WHERE e.sku = $1 ORDER BY e.id`, sku))
}

// DueDraws returns up to limit SKUs whose draw is due on Postgres' clock
// (OPEN past closes_at) or drawn but not yet applied to Redis.
func (ds Draws) DueDraws(ctx context.Context, limit int) ([]string, error) {
	rows, err := ds.l.pool.Query(ctx, `
		SELECT sku FROM draws
		WHERE (status = 'OPEN' AND closes_at <= clock_timestamp()) OR (status = 'DRAWN' AND applied_at IS NULL)
		ORDER BY closes_at LIMIT $1`, limit)
	if err != nil {
		return nil, interpret(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, interpret(err)
}

// DrawOutcome is the result of the draw for one entry.
type DrawOutcome struct {
	ID    int64
	Place int
	Won   bool
	Token string
}

// DrawDecider computes a draw's outcomes from its seed, the units it gives
// out and its entries by id. It must be deterministic: a draw that did not
// commit is decided again.
type DrawDecider func(seed []byte, stock int, entries []DrawEntry) ([]DrawOutcome, error)

// RunDraw draws a SKU's draw once: under the product's and the draw's row
// locks, in one transaction, it checks the draw is OPEN and due, decides it
// and records every entry's outcome, the winners and the revealed status.
// When the draw is already DRAWN it returns it unchanged (drawn false); when
// it is not due yet, ErrInvalid.
func (ds Draws) RunDraw(ctx context.Context, sku string, decide DrawDecider) (d Draw, drawn bool, err error) {
	err = ds.l.inTx(ctx, "run_draw", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		var total, sold, held int
		if err := tx.QueryRow(ctx, `SELECT total, sold FROM products WHERE sku = $1 FOR UPDATE`, sku).Scan(&total, &sold); err != nil {
			return interpret(err)
		}
		// Units held when the draw runs are not the draw's to give: no path
		// may hold a draw's units before it (the policy refuses them all),
		// so this is 0 unless something did, and then the draw still gives
		// out only what is free.
		if err := tx.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM reservations WHERE sku = $1 AND status = 'HELD'`, sku).
			Scan(&held); err != nil {
			return interpret(err)
		}
		var (
			status string
			seed   []byte
			due    bool
		)
		if err := tx.QueryRow(ctx, `SELECT status, seed, closes_at <= clock_timestamp() FROM draws WHERE sku = $1 FOR UPDATE`, sku).
			Scan(&status, &seed, &due); err != nil {
			return interpret(err)
		}
		if status == DrawDrawn {
			return nil
		}
		if !due {
			return fmt.Errorf("draw of %s: %w: not closed yet", sku, ErrInvalid)
		}
		// Not drawn yet: no entry has a result row.
		entries, err := collectEntries(tx.Query(ctx, `SELECT id, sku, principal, quantity, entered_at, 'ENTERED', 0, ''
			FROM draw_entries WHERE sku = $1 ORDER BY id`, sku))
		if err != nil {
			return err
		}
		stock := max(total-sold-held, 0)
		out, err := decide(seed, stock, entries)
		if err != nil {
			return err
		}
		rows := make([][]any, len(out))
		winners := 0
		for i, o := range out {
			var token *string
			if o.Won {
				token = &out[i].Token
				winners++
			}
			rows[i] = []any{sku, int32(o.Place), o.ID, o.Won, token}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"draw_results"}, []string{"sku", "place", "entry_id", "won", "token"},
			pgx.CopyFromRows(rows)); err != nil {
			return interpret(err)
		}
		_, err = tx.Exec(ctx, `
			UPDATE draws SET status = 'DRAWN', stock = $2, entries = $3, winners = $4, drawn_at = clock_timestamp()
			WHERE sku = $1`, sku, stock, len(entries), winners)
		drawn = true
		return interpret(err)
	})
	if err != nil {
		return Draw{}, false, fmt.Errorf("drawing %s: %w", sku, err)
	}
	d, err = ds.Draw(ctx, sku)
	return d, drawn, err
}

// DrawResult returns a drawn SKU's entries in draw order (place 1 first).
func (ds Draws) DrawResult(ctx context.Context, sku string) ([]DrawEntry, error) {
	return collectEntries(ds.l.pool.Query(ctx, `SELECT `+entryColumns+` FROM draw_results r JOIN draw_entries e ON e.id = r.entry_id
		WHERE r.sku = $1 ORDER BY r.place`, sku))
}

// MarkDrawApplied records that Redis has a drawn SKU's result.
func (ds Draws) MarkDrawApplied(ctx context.Context, sku string) error {
	_, err := ds.l.pool.Exec(ctx, `UPDATE draws SET applied_at = clock_timestamp() WHERE sku = $1 AND status = 'DRAWN' AND applied_at IS NULL`, sku)
	return interpret(err)
}

// RecordDrawUnheld records, for winners of a drawn SKU whose hold could not
// be made in Redis (by token), why: the refusal the policy gave. A winner
// recorded before is left as it is; the tokens recorded now are returned, so
// a caller that runs again after a crash reports each winner once.
func (ds Draws) RecordDrawUnheld(ctx context.Context, sku string, unheld map[string]string) ([]string, error) {
	if len(unheld) == 0 {
		return nil, nil
	}
	tokens := make([]string, 0, len(unheld))
	codes := make([]string, 0, len(unheld))
	for t, c := range unheld {
		tokens = append(tokens, t)
		codes = append(codes, c)
	}
	rows, err := ds.l.pool.Query(ctx, `
		UPDATE draw_results r SET unheld = v.code FROM unnest($2::text[], $3::text[]) AS v(token, code)
		WHERE r.sku = $1 AND r.won AND r.token = v.token AND r.unheld IS NULL RETURNING r.token`, sku, tokens, codes)
	if err != nil {
		return nil, interpret(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, interpret(err)
}

// DrawHandout is what a drawn SKU's draw handed out, as the ledger records
// it: what a verifier checks besides the shuffle.
type DrawHandout struct {
	// Total is the product's total when the draw ran: its creation and the
	// restocks recorded up to drawn_at.
	Total int
	// Others is the units that reservations other than the winners' held
	// or had sold when the draw ran (made before it, not released before it).
	Others int
	// Winners are the winning entries in draw order, each with what the
	// ledger has under its token.
	Winners []WinnerHandout
}

// WinnerHandout is one winner of a draw and its reservation.
type WinnerHandout struct {
	Entry DrawEntry
	// Unheld is why its hold could not be made ("" when it was).
	Unheld string
	// Held is its reservation in the ledger; nil when there is none.
	Held *Reservation
}

// DrawHandout reads what a drawn SKU's draw handed out (see DrawHandout).
func (ds Draws) DrawHandout(ctx context.Context, sku string) (DrawHandout, error) {
	var h DrawHandout
	// One snapshot for every read.
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	err := ds.l.inTx(ctx, "draw_handout", opts, func(ctx context.Context, tx pgx.Tx) error {
		var drawn *time.Time
		if err := tx.QueryRow(ctx, `SELECT drawn_at FROM draws WHERE sku = $1`, sku).Scan(&drawn); err != nil {
			return interpret(err)
		}
		if drawn == nil {
			return fmt.Errorf("draw of %s: %w: not drawn", sku, ErrInvalid)
		}
		if err := tx.QueryRow(ctx, `
			SELECT coalesce(sum(quantity), 0) FROM stock_movements
			WHERE sku = $1 AND kind IN ('create', 'restock') AND occurred_at <= $2`, sku, *drawn).Scan(&h.Total); err != nil {
			return interpret(err)
		}
		if err := tx.QueryRow(ctx, `
			SELECT coalesce(sum(v.quantity), 0) FROM reservations v
			WHERE v.sku = $1 AND v.created_at <= $2 AND (v.status IN ('HELD', 'COMMITTED') OR v.ended_at > $2)
			  AND NOT EXISTS (SELECT 1 FROM draw_results r WHERE r.sku = $1 AND r.won AND r.token = v.token)`,
			sku, *drawn).Scan(&h.Others); err != nil {
			return interpret(err)
		}
		rows, err := tx.Query(ctx, `SELECT `+entryColumns+`, coalesce(r.unheld, ''), v.token IS NOT NULL,
				coalesce(v.principal, ''), coalesce(v.quantity, 0), coalesce(v.status, ''), coalesce(v.created_at, 'epoch')
			FROM draw_results r JOIN draw_entries e ON e.id = r.entry_id LEFT JOIN reservations v ON v.token = r.token
			WHERE r.sku = $1 AND r.won ORDER BY r.place`, sku)
		if err != nil {
			return interpret(err)
		}
		h.Winners, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (WinnerHandout, error) {
			var (
				w   WinnerHandout
				has bool
				v   Reservation
			)
			err := row.Scan(&w.Entry.ID, &w.Entry.SKU, &w.Entry.Principal, &w.Entry.Quantity, &w.Entry.EnteredAt,
				&w.Entry.Status, &w.Entry.Place, &w.Entry.Token, &w.Unheld, &has, &v.Principal, &v.Quantity, &v.Status, &v.CreatedAt)
			if has {
				v.Token, v.SKU = w.Entry.Token, sku
				w.Held = &v
			}
			return w, err
		})
		return interpret(err)
	})
	if err != nil {
		return DrawHandout{}, fmt.Errorf("reading what the draw of %s handed out: %w", sku, err)
	}
	return h, nil
}
