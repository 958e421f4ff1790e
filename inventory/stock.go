package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stock is a SKU's live counters. Available + Held + Sold == Total always.
type Stock struct {
	SKU       string
	Available int
	Held      int
	Sold      int
	Total     int
	UpdatedAt time.Time
	// Seq grows with every change of this SKU's stock (it restarts higher
	// after a rebuild); subscribers use it to drop out-of-order updates.
	Seq int64
}

var stockFields = []string{"total", "avail", "held", "sold", "seq", "upd"}

func stockFrom(sku string, vals []any) (Stock, bool) {
	if len(vals) != len(stockFields) || vals[0] == nil {
		return Stock{}, false
	}
	n := func(i int) int64 {
		s, _ := vals[i].(string)
		v, _ := strconv.ParseInt(s, 10, 64)
		return v
	}
	s := Stock{SKU: sku, Total: int(n(0)), Available: int(n(1)), Held: int(n(2)), Sold: int(n(3)),
		Seq: n(4), UpdatedAt: msTime(n(5))}
	if s.Available < 0 {
		// Only after Redis lost state mid-commit (see finish_commit.lua):
		// more is held than is left, and Postgres will refuse the excess.
		// Nothing is available; the counters settle when the excess hold ends.
		s.Available = 0
	}
	return s, true
}

// Stock returns a SKU's live stock, rebuilding it from Postgres first when
// Redis has lost it. A *NotFoundError for an unknown SKU.
func (a Catalog) Stock(ctx context.Context, sku string) (Stock, error) {
	e := a.e
	all, err := e.Catalog().StockMany(ctx, []string{sku})
	if err != nil {
		return Stock{}, err
	}
	if all[0] == nil {
		return Stock{}, productNotFound(sku)
	}
	return *all[0], nil
}

// StockMany returns the stock of several SKUs in one Redis round trip (one
// per cluster node); a nil entry is an unknown SKU. SKUs that Redis lost are
// rebuilt from Postgres, then read again.
func (a Catalog) StockMany(ctx context.Context, skus []string) ([]*Stock, error) {
	e := a.e
	out := make([]*Stock, len(skus))
	missing, err := e.readStocks(ctx, skus, out)
	if err != nil {
		return nil, err
	}
	if len(missing) == 0 {
		return out, nil
	}
	var again []string
	var idx []int
	for _, i := range missing {
		err := e.Rebuild(ctx, skus[i])
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading stock of %s: %w", skus[i], err)
		}
		again = append(again, skus[i])
		idx = append(idx, i)
	}
	if len(again) == 0 {
		return out, nil
	}
	re := make([]*Stock, len(again))
	if _, err := e.readStocks(ctx, again, re); err != nil {
		return nil, err
	}
	for j, i := range idx {
		out[i] = re[j]
	}
	return out, nil
}

func (e *Engine) readStocks(ctx context.Context, skus []string, out []*Stock) (missing []int, err error) {
	cmds := make([]*redis.SliceCmd, len(skus))
	_, err = e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, sku := range skus {
			if !ValidSKU(sku) {
				continue
			}
			cmds[i] = p.HMGet(ctx, e.keys.SKU(sku), stockFields...)
		}
		return nil
	})
	if err != nil {
		return nil, unavailable("reading stock", err)
	}
	for i, c := range cmds {
		if c == nil {
			continue // an invalid SKU cannot exist
		}
		if s, ok := stockFrom(skus[i], c.Val()); ok {
			out[i] = &s
		} else {
			missing = append(missing, i)
		}
	}
	return missing, nil
}
