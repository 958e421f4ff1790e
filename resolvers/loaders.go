package resolvers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vikstrous/dataloadgen"

	"github.com/dropline/dropline/inventory"
)

// loaders are per request: they batch the stock of every product on a page
// into one StockMany call (one Redis round trip) and cache it for the
// request only, so no request sees another's data. Each is made when a
// resolver first asks for it: most operations (a reserve, a commit) use
// none.
type loaders struct {
	engine *inventory.Engine

	stockOnce, productOnce, dropOnce sync.Once
	stockL                           *dataloadgen.Loader[string, *inventory.Stock]
	productL                         *dataloadgen.Loader[string, *inventory.Product]
	dropL                            *dataloadgen.Loader[string, *inventory.Drop]
}

type loadersKey struct{}

// loaderWait is how long a loader gathers keys before fetching; gqlgen
// resolves a page's fields concurrently, well within it.
const loaderWait = 2 * time.Millisecond

func withLoaders(ctx context.Context, e *inventory.Engine) context.Context {
	return context.WithValue(ctx, loadersKey{}, &loaders{engine: e})
}

func (l *loaders) stock() *dataloadgen.Loader[string, *inventory.Stock] {
	l.stockOnce.Do(func() { l.stockL = l.newStock() })
	return l.stockL
}

func (l *loaders) product() *dataloadgen.Loader[string, *inventory.Product] {
	l.productOnce.Do(func() { l.productL = l.newProduct() })
	return l.productL
}

func (l *loaders) drop() *dataloadgen.Loader[string, *inventory.Drop] {
	l.dropOnce.Do(func() { l.dropL = l.newDrop() })
	return l.dropL
}

func (l *loaders) newStock() *dataloadgen.Loader[string, *inventory.Stock] {
	e := l.engine
	return dataloadgen.NewLoader(func(ctx context.Context, skus []string) ([]*inventory.Stock, []error) {
		out, err := e.StockMany(ctx, skus)
		if err != nil {
			return nil, []error{fmt.Errorf("loading stock: %w", err)}
		}
		return out, nil
	}, dataloadgen.WithWait(loaderWait))
}

// newProduct: the engine has no batch product read yet, so this loader only
// de-duplicates (a page of reservations of one SKU reads it once).
func (l *loaders) newProduct() *dataloadgen.Loader[string, *inventory.Product] {
	return dataloadgen.NewLoader(oneByOne(l.engine.Product), dataloadgen.WithWait(loaderWait))
}

// newDrop: drops are few, so this loader de-duplicates (a page of one
// drop's products reads it once).
func (l *loaders) newDrop() *dataloadgen.Loader[string, *inventory.Drop] {
	return dataloadgen.NewLoader(oneByOne(l.engine.Drop), dataloadgen.WithWait(loaderWait))
}

// oneByOne is a loader's fetch that reads each key on its own with read,
// for what the engine cannot read in batches.
func oneByOne[V any](read func(context.Context, string) (V, error)) func(context.Context, []string) ([]*V, []error) {
	return func(ctx context.Context, keys []string) ([]*V, []error) {
		out := make([]*V, len(keys))
		errs := make([]error, len(keys))
		for i, k := range keys {
			v, err := read(ctx, k)
			if err != nil {
				errs[i] = err
				continue
			}
			out[i] = &v
		}
		return out, errs
	}
}

func loadersFrom(ctx context.Context) *loaders {
	l, _ := ctx.Value(loadersKey{}).(*loaders)
	return l
}
