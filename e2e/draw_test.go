package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
)

const enterDrawMutation = `mutation($input: EnterDrawInput!) {
  enterDraw(input: $input) { entry { sku quantity status place } userErrors { code message } } }`

type drawEntry struct {
	Sku         string       `json:"sku"`
	Quantity    int          `json:"quantity"`
	Status      string       `json:"status"`
	Place       *int         `json:"place"`
	Reservation *reservation `json:"reservation"`
}

type enterDrawOut struct {
	EnterDraw struct {
		Entry      *drawEntry  `json:"entry"`
		UserErrors []userError `json:"userErrors"`
	} `json:"enterDraw"`
}

type drawInfo struct {
	Status   string  `json:"status"`
	Entries  int     `json:"entries"`
	SeedHash string  `json:"seedHash"`
	Seed     *string `json:"seed"`
	Winners  *int    `json:"winners"`
}

func (s *system) draw(t *testing.T, sku string) drawInfo {
	t.Helper()
	var out struct {
		Product struct {
			Draw *drawInfo `json:"draw"`
		} `json:"product"`
	}
	r := s.gql(t, http.DefaultClient, "", `query($sku: ID!) { product(sku: $sku) { draw { status entries seedHash seed winners } } }`,
		map[string]any{"sku": sku}, &out)
	require.Empty(t, r.Errors)
	require.NotNil(t, out.Product.Draw)
	return *out.Product.Draw
}

// A drop sold by draw, over HTTP against the real server and its worker
// group: 300 buyers enter twice at once (one entry each), reserve is
// refused, the server's own drawer draws once entries close, every buyer
// learns its outcome, the winners hold exactly the stock they were given, and
// the revealed seed hashes to what was published before.
func TestDrawOverHTTP(t *testing.T) {
	t.Parallel()
	s := start(t)
	const sku, units, buyers = "E2E-DRAW", 40, 300
	var created struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	r := s.gql(t, http.DefaultClient, s.token(t, "ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "name": "Draw", "price": map[string]any{"amount": 4200, "currency": "EUR"},
			"stock": units, "draw": map[string]any{"closesAt": time.Now().Add(time.Hour).Format(time.RFC3339), "winnerHoldSeconds": 600}}}, &created)
	require.Empty(t, r.Errors)
	require.Empty(t, created.CreateProduct.UserErrors)
	before := s.draw(t, sku)
	require.Equal(t, "OPEN", before.Status)
	require.Nil(t, before.Seed)
	require.Nil(t, before.Winners)

	tokens := make([]string, buyers)
	for i := range tokens {
		tokens[i] = s.token(t, buyerName(i), false)
	}
	var refused enterDrawOut
	r = s.gql(t, http.DefaultClient, tokens[0], enterDrawMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 0}}, &refused)
	require.Empty(t, r.Errors)
	require.Equal(t, "INVALID_INPUT", refused.EnterDraw.UserErrors[0].Code)
	var reserved struct {
		Reserve struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"reserve"`
	}
	s.gql(t, http.DefaultClient, tokens[0], reserveMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}, &reserved)
	require.Len(t, reserved.Reserve.UserErrors, 1)
	require.Equal(t, "DRAW_ONLY", reserved.Reserve.UserErrors[0].Code)

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	type outcome struct {
		r   gqlResponse
		err error
		out enterDrawOut
	}
	outs := make([]outcome, 2*buyers)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			o := &outs[i]
			o.r, o.err = s.tryGQL(client, tokens[i%buyers], enterDrawMutation,
				map[string]any{"input": map[string]any{"sku": sku, "quantity": 1 + i%buyers%2}}, &o.out)
		})
	}
	wg.Wait()
	for i, o := range outs {
		require.NoError(t, o.err, "entry %d", i)
		require.Empty(t, o.r.Errors, "entry %d", i)
		require.Empty(t, o.out.EnterDraw.UserErrors, "entry %d", i)
		require.Equal(t, "ENTERED", o.out.EnterDraw.Entry.Status)
		require.Equal(t, 1+i%buyers%2, o.out.EnterDraw.Entry.Quantity)
	}
	require.Equal(t, buyers, s.scalar(t, `SELECT count(*) FROM draw_entries WHERE sku = $1`, sku))
	require.Equal(t, buyers, s.draw(t, sku).Entries)

	// Close the entries now (on Postgres' clock) instead of waiting an hour.
	_, err := s.Pool.Exec(context.Background(), `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = $1`, sku)
	require.NoError(t, err)
	var late enterDrawOut
	s.gql(t, http.DefaultClient, s.token(t, "latecomer", false), enterDrawMutation,
		map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}}, &late)
	require.Len(t, late.EnterDraw.UserErrors, 1)
	require.Equal(t, "SALE_NOT_ACTIVE", late.EnterDraw.UserErrors[0].Code)

	var after drawInfo
	require.Eventually(t, func() bool {
		after = s.draw(t, sku)
		return after.Status == "DRAWN" && s.scalar(t, `SELECT count(*) FROM draws WHERE sku = $1 AND applied_at IS NOT NULL`, sku) == 1
	}, 30*time.Second, 100*time.Millisecond, "the server's drawer draws once entries close")
	require.NotNil(t, after.Seed)
	seed, err := hex.DecodeString(*after.Seed)
	require.NoError(t, err)
	sum := sha256.Sum256(seed)
	require.Equal(t, before.SeedHash, hex.EncodeToString(sum[:]), "the revealed seed is the one published before")

	won, wonUnits, lost := 0, 0, 0
	places := map[int]bool{}
	for i := range buyers {
		var mine struct {
			MyDrawEntries []drawEntry `json:"myDrawEntries"`
		}
		r := s.gql(t, client, tokens[i], `{ myDrawEntries { sku quantity status place reservation { token status quantity } } }`, nil, &mine)
		require.Empty(t, r.Errors)
		require.Len(t, mine.MyDrawEntries, 1, "buyer %d", i)
		e := mine.MyDrawEntries[0]
		require.NotNil(t, e.Place)
		require.False(t, places[*e.Place], "one place per entry")
		places[*e.Place] = true
		switch e.Status {
		case "WON":
			require.NotNil(t, e.Reservation, "buyer %d", i)
			require.Equal(t, "HELD", e.Reservation.Status)
			require.Equal(t, e.Quantity, e.Reservation.Quantity)
			won++
			wonUnits += e.Quantity
		case "LOST":
			require.Nil(t, e.Reservation)
			lost++
		default:
			t.Fatalf("buyer %d: status %s after the draw", i, e.Status)
		}
	}
	require.Equal(t, *after.Winners, won)
	require.Equal(t, buyers, won+lost)
	require.LessOrEqual(t, wonUnits, units)
	require.Greater(t, wonUnits, units-2, "the stock is filled but for what no entry fits")
	st := s.stock(t, sku)
	require.Equal(t, stock{Available: units - wonUnits, Held: wonUnits, Sold: 0, Total: units}, st)
	require.Equal(t, lost, s.scalar(t, `SELECT count(*) FROM draw_results WHERE sku = $1 AND NOT won`, sku))
}

// TestDrawResultPushedOverWebsocket: entrants watch their entry with
// myDrawEntryChanged, each on a websocket of its own, and are told their
// result without polling: first ENTERED, then, once the server's drawer
// has carried the draw out, WON with its HELD reservation or LOST with its
// place, then completion; each push agrees with the ledger's result. A
// principal without an entry is refused NOT_FOUND, and one who subscribes
// after the draw gets its result at once.
func TestDrawResultPushedOverWebsocket(t *testing.T) {
	t.Parallel()
	s := start(t)
	const sku, units, buyers = "E2E-DRAW-PUSH", 10, 30
	var created struct {
		CreateProduct struct {
			UserErrors []userError `json:"userErrors"`
		} `json:"createProduct"`
	}
	r := s.gql(t, http.DefaultClient, s.token(t, "ops", true),
		`mutation($input: CreateProductInput!) { createProduct(input: $input) { userErrors { code message } } }`,
		map[string]any{"input": map[string]any{"sku": sku, "name": "Draw", "price": map[string]any{"amount": 4200, "currency": "EUR"},
			"stock": units, "draw": map[string]any{"closesAt": time.Now().Add(time.Hour).Format(time.RFC3339), "winnerHoldSeconds": 600}}}, &created)
	require.Empty(t, r.Errors)
	require.Empty(t, created.CreateProduct.UserErrors)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const doc = `subscription($sku: ID!) { myDrawEntryChanged(sku: $sku) { sku quantity status place reservation { token status quantity } } }`
	dial := func(token string) *wsclient.Client {
		c, err := wsclient.Dial(ctx, s.wsURL(), wsclient.Options{InitPayload: map[string]any{"Authorization": "Bearer " + token}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// Without an entry: NOT_FOUND.
	stranger, err := dial(s.token(t, "stranger", false)).Subscribe(ctx, doc, map[string]any{"sku": sku})
	require.NoError(t, err)
	m, ok, err := stranger.Next(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, m.Errors, 1)
	require.Equal(t, "NOT_FOUND", m.Errors[0].Code())

	tokens := make([]string, buyers)
	subs := make([]*wsclient.Subscription, buyers)
	for i := range buyers {
		tokens[i] = s.token(t, buyerName(i), false)
		var out enterDrawOut
		r := s.gql(t, http.DefaultClient, tokens[i], enterDrawMutation, map[string]any{"input": map[string]any{"sku": sku, "quantity": 1 + i%2}}, &out)
		require.Empty(t, r.Errors)
		require.Empty(t, out.EnterDraw.UserErrors)
		subs[i], err = dial(tokens[i]).Subscribe(ctx, doc, map[string]any{"sku": sku})
		require.NoError(t, err)
	}
	next := func(i int, sub *wsclient.Subscription) drawEntry {
		t.Helper()
		m, ok, err := sub.Next(ctx)
		require.NoError(t, err, "buyer %d", i)
		require.True(t, ok, "buyer %d: the stream ended early", i)
		require.Empty(t, m.Errors, "buyer %d", i)
		var out struct{ MyDrawEntryChanged drawEntry }
		require.NoError(t, json.Unmarshal(m.Data, &out))
		return out.MyDrawEntryChanged
	}
	for i, sub := range subs {
		e := next(i, sub)
		require.Equal(t, "ENTERED", e.Status, "buyer %d", i)
		require.Nil(t, e.Place)
	}

	_, err = s.Pool.Exec(context.Background(), `UPDATE draws SET closes_at = clock_timestamp() WHERE sku = $1`, sku)
	require.NoError(t, err)
	won := 0
	for i, sub := range subs {
		e := next(i, sub)
		var place int
		var wonRow bool
		require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT r.place, r.won FROM draw_results r
			JOIN draw_entries e ON e.id = r.entry_id WHERE e.sku = $1 AND e.principal = $2`, sku, buyerName(i)).Scan(&place, &wonRow))
		require.NotNil(t, e.Place, "buyer %d", i)
		require.Equal(t, place, *e.Place, "buyer %d: the pushed place is the ledger's", i)
		if wonRow {
			won++
			require.Equal(t, "WON", e.Status, "buyer %d", i)
			require.NotNil(t, e.Reservation, "buyer %d: a winner is pushed with its hold", i)
			require.Equal(t, "HELD", e.Reservation.Status)
			require.Equal(t, e.Quantity, e.Reservation.Quantity)
		} else {
			require.Equal(t, "LOST", e.Status, "buyer %d", i)
			require.Nil(t, e.Reservation)
		}
		_, ok, err := sub.Next(ctx)
		require.NoError(t, err)
		require.False(t, ok, "buyer %d: the stream completes after the result", i)
	}
	require.Positive(t, won)
	require.Equal(t, 1, s.scalar(t, `SELECT count(*) FROM draws WHERE sku = $1 AND applied_at IS NOT NULL`, sku),
		"told only once the result is carried out")

	// After the draw: the result at once, then completion.
	late, err := dial(tokens[0]).Subscribe(ctx, doc, map[string]any{"sku": sku})
	require.NoError(t, err)
	e := next(0, late)
	require.Contains(t, []string{"WON", "LOST"}, e.Status)
	_, ok, err = late.Next(ctx)
	require.NoError(t, err)
	require.False(t, ok)
}
