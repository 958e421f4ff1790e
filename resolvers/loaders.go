package resolvers

import (
	"context"
	"fmt"
	"time"

	"github.com/vikstrous/dataloadgen"

	"github.com/dropline/dropline/inventory"
)

// loaders are per request: they batch the stock of every product on a page
// into one StockMany call (one Redis round trip) and cache it for the
// request only, so no request sees another's data.
type loaders struct {
	stock   *dataloadgen.Loader[string, *inventory.Stock]
	product *dataloadgen.Loader[string, *inventory.Product]
	drop    *dataloadgen.Loader[string, *inventory.Drop]
}

type loadersKey struct{}

// loaderWait is how long a loader gathers keys before fetching; gqlgen
// resolves a page's fields concurrently, well within it.
const loaderWait = 2 * time.Millisecond

func withLoaders(ctx context.Context, e *inventory.Engine) context.Context {
	l := &loaders{
		stock: dataloadgen.NewLoader(func(ctx context.Context, skus []string) ([]*inventory.Stock, []error) {
			out, err := e.StockMany(ctx, skus)
			if err != nil {
				return nil, []error{fmt.Errorf("loading stock: %w", err)}
			}
			return out, nil
		}, dataloadgen.WithWait(loaderWait)),
		// The engine has no batch product read yet: this loader only
		// de-duplicates (a page of reservations of one SKU reads it once).
		product: dataloadgen.NewLoader(func(ctx context.Context, skus []string) ([]*inventory.Product, []error) {
			out := make([]*inventory.Product, len(skus))
			errs := make([]error, len(skus))
			for i, sku := range skus {
				p, err := e.Product(ctx, sku)
				if err != nil {
					errs[i] = err
					continue
				}
				out[i] = &p
			}
			return out, errs
		}, dataloadgen.WithWait(loaderWait)),
		// Drops are few: this loader de-duplicates (a page of one drop's
		// products reads it once).
		drop: dataloadgen.NewLoader(func(ctx context.Context, ids []string) ([]*inventory.Drop, []error) {
			out := make([]*inventory.Drop, len(ids))
			errs := make([]error, len(ids))
			for i, id := range ids {
				d, err := e.Drop(ctx, id)
				if err != nil {
					errs[i] = err
					continue
				}
				out[i] = &d
			}
			return out, errs
		}, dataloadgen.WithWait(loaderWait)),
	}
	return context.WithValue(ctx, loadersKey{}, l)
}

func loadersFrom(ctx context.Context) *loaders {
	l, _ := ctx.Value(loadersKey{}).(*loaders)
	return l
}
