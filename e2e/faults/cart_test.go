package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

const reserveCartMutation = `mutation($input: ReserveCartInput!) {
  reserveCart(input: $input) { cart { token status lines { token sku } } userErrors { code field message available } } }`

// TestCartKilledMidway kills (SIGKILL) a server in the middle of a cart,
// twice: once when every partition's lines are held provisionally, once when
// the first partition's lines are already confirmed with the cart's full
// expiry and the others are not. The server is held between those steps by
// the test-only DROPLINE_TEST_CART_PAUSE. A second server lives on. Each
// time, every unit the dead cart held is back for other buyers within 5
// seconds of the kill (the contract's bound; the design gives about 2.5 s),
// another buyer gets them through the survivor, and the ledger is left with
// no line held.
func TestCartKilledMidway(t *testing.T) {
	testenv.Quiet(t)
	t.Parallel()
	s := newSystem(t)
	b := s.start("survivor")
	for round, step := range []string{"provisional holds made", "first partition's lines confirmed"} {
		s.Env["DROPLINE_TEST_CART_PAUSE"] = []string{"held", "confirmed"}[round] + ":30s"
		victim := s.start(fmt.Sprintf("victim-%d", round))
		skus := []string{skuIn(fmt.Sprintf("CARTKILL%d", round), 1), skuIn(fmt.Sprintf("CARTKILL%d", round), 6), skuIn(fmt.Sprintf("CARTKILL%d", round), 11)}
		var lines []any
		for _, sku := range skus {
			s.createProduct(b, sku, 2, 0)
			lines = append(lines, map[string]any{"sku": sku, "quantity": 2})
		}
		ctx, cancel := context.WithCancel(context.Background())
		client := &http.Client{Timeout: time.Minute}
		go func() {
			// Never answered: the server dies under it.
			post(ctx, client, victim.URL, s.token("dying-buyer", false), reserveCartMutation, map[string]any{"input": map[string]any{"lines": lines}})
		}()
		eventually(t, 20*time.Second, "the victim pauses at "+step, func() (bool, string) {
			return strings.Contains(victim.log.String(), step), "not yet"
		})
		for _, sku := range skus {
			st, ok := s.redisStock(context.Background(), sku)
			require.True(t, ok)
			require.Equal(t, 2, st.Held, "%s: the cart holds its units when the server dies", sku)
		}
		victim.kill(t)
		killed := time.Now()
		cancel()

		var freed time.Duration
		eventually(t, 10*time.Second, "the dead cart's units are free", func() (bool, string) {
			for _, sku := range skus {
				st, ok := s.redisStock(context.Background(), sku)
				if !ok || st.Available != 2 || st.Held != 0 {
					return false, fmt.Sprintf("%s: %+v", sku, st)
				}
			}
			freed = time.Since(killed)
			return true, ""
		})
		t.Logf("killed at %q: every unit free %v after the kill", step, freed.Round(time.Millisecond))
		require.Less(t, freed, 5*time.Second, "no unit stays held by an interrupted cart for more than 5 s")

		// Another buyer gets every unit, through the survivor.
		var out struct {
			ReserveCart struct {
				Cart *struct {
					Status string `json:"status"`
				} `json:"cart"`
				UserErrors []userError `json:"userErrors"`
			} `json:"reserveCart"`
		}
		s.mustGQL(b, s.token(fmt.Sprintf("next-buyer-%d", round), false), reserveCartMutation, map[string]any{"input": map[string]any{"lines": lines}}, &out)
		require.Empty(t, out.ReserveCart.UserErrors)
		require.Equal(t, "HELD", out.ReserveCart.Cart.Status)

		// The ledger: the dead buyer's lines that reached it (the confirmed
		// ones) end released, none is left HELD.
		eventually(t, 20*time.Second, "the ledger holds nothing for the dead cart", func() (bool, string) {
			n := s.scalar(`SELECT count(*) FROM reservations WHERE principal = 'dying-buyer' AND status = 'HELD'`)
			return n == 0, fmt.Sprintf("%d held", n)
		})
		if round == 1 {
			require.Equal(t, 1, s.scalar(`SELECT count(*) FROM reservations WHERE principal = 'dying-buyer' AND status = 'CANCELLED'`),
				"the confirmed line reached the ledger and was let go there too")
		}
	}
}
