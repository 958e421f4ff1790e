package flashsale_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/bench/flashsale"
)

// consistent is a drop that kept every promise: 100 units, 3 sold to
// buyers who were told, 2 held, the rest available.
func consistent() flashsale.VerdictInput {
	return flashsale.VerdictInput{
		Observed: flashsale.Observed{
			Committed: map[string]int{"a": 1, "b": 1, "c": 1},
			Unknown:   map[string]int{},
			Samples: []flashsale.StockSample{
				{T: 0, Stock: flashsale.Stock{Available: 100, Total: 100}},
				{T: 0.1, Stock: flashsale.Stock{Available: 95, Held: 5, Total: 100}},
				{T: 0.2, Stock: flashsale.Stock{Available: 95, Held: 2, Sold: 3, Total: 100}},
			},
		},
		API: flashsale.Stock{Available: 95, Held: 2, Sold: 3, Total: 100},
		Ledger: &flashsale.LedgerState{Total: 100, Sold: 3, Held: 2, SalesUnits: 3,
			Sales: map[string]int{"a": 1, "b": 1, "c": 1}},
		Settled: true,
	}
}

// failedNames lists the names of the failed checks.
func failedNames(v flashsale.Verdict) []string {
	var out []string
	for _, c := range v.Failed() {
		out = append(out, c.Name)
	}
	return out
}

func TestJudgeConsistentDropPasses(t *testing.T) {
	t.Parallel()
	v := flashsale.Judge(consistent())
	require.True(t, v.OK, "%+v", v.Failed())
	require.Equal(t, 0, v.Oversold)
	require.Equal(t, 3, v.SoldUnits)
	require.Equal(t, 2, v.HeldUnits)
	require.Equal(t, 3, v.CommitsSeen)
	require.Equal(t, 3, v.CommitsInLedger)
}

// TestJudgeInconsistentLedgerFails feeds the verdict one deliberately
// broken ledger (or observation) at a time: each must fail, naming the
// promise it broke.
func TestJudgeInconsistentLedgerFails(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		breakIt  func(in *flashsale.VerdictInput)
		failed   string
		oversold int
	}{
		"ledger oversold": {func(in *flashsale.VerdictInput) {
			// One unit more held than exists: sold+held = total+1, the
			// off-by-one at the boundary.
			in.Ledger.Held = 98
		}, "no oversell in the ledger", 1},
		"sold above total with matching sales": {func(in *flashsale.VerdictInput) {
			in.Ledger.Total, in.Ledger.Held = 2, 0
		}, "no oversell in the ledger", 1},
		"products.sold disagrees with sales rows": {func(in *flashsale.VerdictInput) {
			in.Ledger.Sold = 4
		}, "ledger sold matches its sales rows", 0},
		"confirmed commit missing from Postgres": {func(in *flashsale.VerdictInput) {
			delete(in.Ledger.Sales, "b")
			in.Ledger.Sold, in.Ledger.SalesUnits = 2, 2
		}, "every confirmed commit is a sale in Postgres", 0},
		"sale recorded with another quantity": {func(in *flashsale.VerdictInput) {
			in.Ledger.Sales["c"] = 2
		}, "every confirmed commit is a sale in Postgres", 0},
		"sale nobody was told about": {func(in *flashsale.VerdictInput) {
			in.Ledger.Sales["zz"] = 1
		}, "every sale was confirmed to a buyer", 0},
		"live stock disagrees with ledger": {func(in *flashsale.VerdictInput) {
			in.Ledger.Held = 1
		}, "live stock matches the ledger", 0},
		"ledger never settled": {func(in *flashsale.VerdictInput) {
			in.Settled = false
		}, "live stock matches the ledger", 0},
		"oversold for a moment during the drop": {func(in *flashsale.VerdictInput) {
			in.Observed.Samples = append(in.Observed.Samples,
				flashsale.StockSample{T: 0.15, Stock: flashsale.Stock{Available: 0, Held: 98, Sold: 3, Total: 100}})
		}, "no oversell in live stock during the drop", 0},
		"final live stock oversold": {func(in *flashsale.VerdictInput) {
			in.API = flashsale.Stock{Available: -1, Held: 98, Sold: 3, Total: 100}
		}, "no oversell in final live stock", 1},
		"live counters do not add up": {func(in *flashsale.VerdictInput) {
			in.API.Available = 90
		}, "live counters add up", 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := consistent()
			tc.breakIt(&in)
			v := flashsale.Judge(in)
			require.False(t, v.OK)
			require.Contains(t, failedNames(v), tc.failed)
			require.GreaterOrEqual(t, v.Oversold, tc.oversold)
		})
	}
}

func TestJudgeAllowsSalesWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	in := consistent()
	in.Observed.Unknown = map[string]int{"d": 1, "e": 1}
	in.Ledger.Sales["d"] = 1 // "e" was not sold: also fine
	in.Ledger.Sold, in.Ledger.SalesUnits, in.Ledger.Held = 4, 4, 1
	in.API = flashsale.Stock{Available: 95, Held: 1, Sold: 4, Total: 100}
	v := flashsale.Judge(in)
	require.True(t, v.OK, "%+v", v.Failed())
	require.Equal(t, 2, v.CommitsUnknown)
}

func TestJudgeWithoutLedgerSkipsItsChecks(t *testing.T) {
	t.Parallel()
	in := consistent()
	in.Ledger = nil
	v := flashsale.Judge(in)
	require.True(t, v.OK)
	skipped := 0
	for _, c := range v.Checks {
		if c.Skipped {
			skipped++
			require.True(t, strings.Contains(c.Detail, "--no-ledger"))
		}
	}
	require.Equal(t, 5, skipped)

	in.API.Sold = 101
	require.False(t, flashsale.Judge(in).OK, "the API checks still run")
}

func TestBaselineSalesAreNotThisRun(t *testing.T) {
	t.Parallel()
	in := consistent()
	// An existing SKU that had sold 10 before the drop.
	in.Baseline = flashsale.LedgerState{Total: 100, Sold: 10, SalesUnits: 10}
	in.Ledger.Sold, in.Ledger.SalesUnits = 13, 13
	in.API = flashsale.Stock{Available: 85, Held: 2, Sold: 13, Total: 100}
	v := flashsale.Judge(in)
	require.True(t, v.OK, "%+v", v.Failed())
	require.Equal(t, 3, v.SoldUnits)
}
