package graphql_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/wsclient"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server/graphql"
)

// The response bound holds for the encoded bytes, not only for the
// estimate that stops a response early: names of 200 quotes are estimated
// at half their encoded size, and their page is still refused.
func TestResponseBoundIsTheEncodedSize(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) { c.Limits.ResponseBytes = 1024 })
	for _, sku := range []string{"Q-1", "Q-2", "Q-3"} {
		e.CreateProduct(t, map[string]any{"sku": sku, "stock": 1, "name": strings.Repeat(`"`, 200)})
	}
	errs := e.Do(t, "", `{ products(first: 2) { edges { node { name } } } }`, nil, nil)
	require.Empty(t, errs, "two names, about 900 bytes, fit")
	errs = e.Do(t, "", `{ products(first: 3) { edges { node { name } } } }`, nil, nil)
	require.Len(t, errs, 1)
	require.Equal(t, graphql.CodeResponseTooLarge, errs[0].Code())
}

// A subscription's events are bounded one by one by its price: however
// many it sends, none is refused for what the others added up to, and
// none carries a cost (a subscription spends no budget).
func TestSubscriptionEventsAreNotMeteredTogether(t *testing.T) {
	t.Parallel()
	e := setupLive(t, live.HubConfig{}, func(c *graphql.Config) { c.Limits.ResponseBytes = 1024 })
	e.CreateProduct(t, map[string]any{"sku": "SUB-1", "stock": 100})
	buyer := e.Token(t, "buyer", false)
	s := subscribe(t, e.dial(t, wsclient.Options{}), stockSub, map[string]any{"s": []string{"SUB-1"}})
	for i := range 20 { // about 150 bytes each, 3 KB together
		m, ok := next(t, s, 5*time.Second)
		require.True(t, ok)
		require.Empty(t, m.Errors, "event %d", i)
		var out struct{ StockChanged stock }
		require.NoError(t, json.Unmarshal(m.Data, &out))
		require.Equal(t, 100-i, out.StockChanged.Available)
		require.Empty(t, e.Reserve(t, buyer, map[string]any{"sku": "SUB-1", "quantity": 1}).UserErrors)
	}
}
