package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// readmeBlocks returns the fenced code blocks of the README in the given
// language, verbatim.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	re := regexp.MustCompile("(?ms)^```" + lang + "\n(.*?)^```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(readme), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestReadmeQuickStart does what the README's quick start tells a newcomer:
// what `make run` runs (migrate, seed --demo, serve in dev mode), a token
// from what `make token` runs, then every GraphQL block of the README,
// verbatim, against the real server (a cart block that uses $token gets the
// token of the cart the last reserveCart made, any other the token of the
// last hold a reserve made). Each must succeed without errors or userErrors;
// the single hold's commit and cancel each end one of the README's holds,
// and every hold must be in Redis and, through the write-behind, in Postgres
// with the status the examples left it in; the waitlist join is served at
// once; the README's cart must end COMMITTED.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t, "graphql")
	require.NotEmpty(t, blocks, "the README has a GraphQL example")

	// The Makefile's targets run these commands; check they still do.
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	for _, cmd := range []string{"$(BIN) migrate", "$(BIN) seed --demo", "$(BIN) serve", "$(BIN) token --user"} {
		require.Contains(t, string(makefile), cmd)
	}

	dbURL := testenv.NewUnmigratedDatabase(t) // as on a newcomer's machine
	rdb := testenv.Redis(t)
	envm := map[string]string{
		"DROPLINE_DEV":        "1",
		"DROPLINE_ADDR":       "127.0.0.1:0",
		"DATABASE_URL":        dbURL,
		"REDIS_URL":           os.Getenv("REDIS_URL"),
		"DROPLINE_KEY_PREFIX": rdb.Prefix,
		"DROPLINE_LOG_FORMAT": "json",
	}
	for _, args := range [][]string{{"migrate"}, {"seed", "--demo"}} {
		code, _, errOut := runCmd(t, envm, args...)
		require.Equal(t, 0, code, "%v: %s", args, errOut)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := startServe(ctx, t, envm)
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	})
	code, tok, errOut := runCmd(t, envm, "token", "--user", "alice")
	require.Equal(t, 0, code, errOut)

	// Each hold the README's reserves make, and the status its examples
	// leave it in: HELD, or what its commit or cancel answered.
	type hold struct{ token, sku, status string }
	var holds []hold
	skuArg := regexp.MustCompile(`sku: "([^"]+)"`)
	cartToken := "" // the cart the last reserveCart made: a block's $token
	cartsCommitted := 0
	for _, doc := range blocks {
		req := map[string]any{"query": doc}
		switch {
		case strings.Contains(doc, "Cart(input: {token: $token"):
			// The cart checkout pays for the cart the example before made.
			require.NotEmpty(t, cartToken, "a README cart example that takes $token comes after a reserveCart:\n%s", doc)
			req["variables"] = map[string]any{"token": cartToken}
		case strings.Contains(doc, "$token: ID!"):
			// The README has the reader paste the token of the hold the
			// example before made into the playground's variables.
			require.NotEmpty(t, holds, "a README example that takes $token comes after a reserve:\n%s", doc)
			req["variables"] = map[string]any{"token": holds[len(holds)-1].token}
		}
		body, err := json.Marshal(req)
		require.NoError(t, err)
		hreq, err := http.NewRequest(http.MethodPost, "http://"+s.addr+"/graphql", bytes.NewReader(body))
		require.NoError(t, err)
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("Authorization", "Bearer "+strings.TrimSpace(tok))
		resp, err := http.DefaultClient.Do(hreq)
		require.NoError(t, err)
		var res struct {
			Data   map[string]json.RawMessage `json:"data"`
			Errors []json.RawMessage          `json:"errors"`
		}
		err = json.NewDecoder(resp.Body).Decode(&res)
		require.NoError(t, resp.Body.Close())
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Empty(t, res.Errors, "README example:\n%s", doc)
		for field, raw := range res.Data {
			var payload struct {
				Reservation *struct {
					Token  string `json:"token"`
					Status string `json:"status"`
				} `json:"reservation"`
				Cart *struct {
					Token  string `json:"token"`
					Status string `json:"status"`
				} `json:"cart"`
				Entry *struct {
					Status      string `json:"status"`
					Reservation *struct {
						Token string `json:"token"`
					} `json:"reservation"`
				} `json:"entry"`
				UserErrors []map[string]any `json:"userErrors"`
			}
			require.NoError(t, json.Unmarshal(raw, &payload))
			if field == "reserveCart" && payload.Cart != nil {
				cartToken = payload.Cart.Token
			}
			if field == "commitCart" {
				require.NotNil(t, payload.Cart)
				require.Equal(t, "COMMITTED", payload.Cart.Status)
				cartsCommitted++
			}
			require.Empty(t, payload.UserErrors, "README example %s:\n%s", field, doc)
			switch field {
			case "reserve":
				require.NotNil(t, payload.Reservation)
				require.Equal(t, "HELD", payload.Reservation.Status)
				m := skuArg.FindStringSubmatch(doc)
				require.NotNil(t, m, "the reserve names its SKU")
				holds = append(holds, hold{payload.Reservation.Token, m[1], "HELD"})
			case "joinWaitlist":
				// Taken where the buyer can be served: handed a unit at once.
				require.NotNil(t, payload.Entry)
				require.Equal(t, "OFFERED", payload.Entry.Status, "README example %s:\n%s", field, doc)
				require.NotNil(t, payload.Entry.Reservation)
			case "commit", "cancel":
				want := map[string]string{"commit": "COMMITTED", "cancel": "CANCELLED"}[field]
				require.NotNil(t, payload.Reservation, "README example %s:\n%s", field, doc)
				require.Equal(t, want, payload.Reservation.Status, "README example %s:\n%s", field, doc)
				last := &holds[len(holds)-1]
				require.Equal(t, last.token, payload.Reservation.Token)
				last.status = want
			}
		}
	}
	require.NotEmpty(t, holds, "the README's example reserves")
	// The token the README shows the reader pasting begins as the one its
	// reserve returns (the partition of the SKU).
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	shown := regexp.MustCompile(`\{"token": "(r\d+\.)…"\}`).FindSubmatch(readme)
	require.NotNil(t, shown, "the README shows the reserve's token")
	require.True(t, strings.HasPrefix(holds[0].token, string(shown[1])), "the README shows a token %s…, its reserve returns %s", shown[1], holds[0].token)
	require.Equal(t, 1, cartsCommitted, "the README's cart checkout commits its cart")
	statuses := map[string]int{}
	for _, h := range holds {
		statuses[h.status]++
	}
	require.Equal(t, map[string]int{"COMMITTED": 1, "CANCELLED": 1}, statuses,
		"the README shows the single hold's commit and cancel, each on a hold its reserve made")

	// The holds are real: in Redis now with the status the examples left
	// them in, and in the ledger with it once the write-behind has carried it.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	keys := inventory.NewKeys(rdb.Prefix)
	for _, h := range holds {
		status, err := rdb.Client.HGet(context.Background(), keys.Hold(inventory.PartitionOf(h.sku), h.token), "st").Result()
		require.NoError(t, err)
		require.Equal(t, h.status, status)
		require.Eventually(t, func() bool {
			var st, sku string
			err := pool.QueryRow(context.Background(), `SELECT status, sku FROM reservations WHERE token = $1`, h.token).Scan(&st, &sku)
			return err == nil && st == h.status && sku == h.sku
		}, 10*time.Second, 20*time.Millisecond, "the hold reaches the ledger as %s", h.status)
	}
}
