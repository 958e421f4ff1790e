package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
