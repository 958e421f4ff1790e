package resolvers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vikstrous/dataloadgen"

	"github.com/dropline/dropline/internal/cpugate"
	"github.com/dropline/dropline/inventory"
)

// loaders are per request: every read a field makes once per item of a
// list (a product's stock, draw and drop, a drop's products, a
// reservation's product) goes through one of them, so a page of a hundred
// products costs one read of each kind, not a hundred: one Redis round
// trip for the stock, one Postgres query for each of the rest. Each caches
// for the request only, so no request sees another's data, and each is
// made when a resolver first asks for it: most operations (a reserve, a
// commit) use none.
type loaders struct {
	engine *inventory.Engine

	stockOnce, productOnce, dropOnce, drawOnce sync.Once
	stockL                                     *dataloadgen.Loader[string, *inventory.Stock]
	productL                                   *dataloadgen.Loader[string, *inventory.Product]
	dropL                                      *dataloadgen.Loader[string, *inventory.Drop]
	drawL                                      *dataloadgen.Loader[string, *inventory.Draw]
}

type loadersKey struct{}

// loaderWait is how long a loader gathers keys before fetching; gqlgen
// resolves a page's fields concurrently, within it even on a loaded
// machine (at 2 ms a busy 2-core machine split a page's reads in two).
const loaderWait = 5 * time.Millisecond

func withLoaders(ctx context.Context, e *inventory.Engine) context.Context {
	return context.WithValue(ctx, loadersKey{}, &loaders{engine: e})
}

// stock loads SKUs' live stock from Redis (nil: no such SKU).
func (l *loaders) stock() *dataloadgen.Loader[string, *inventory.Stock] {
	l.stockOnce.Do(func() { l.stockL = batched("stock", l.engine.Catalog().StockMany) })
	return l.stockL
}

// product loads products by SKU from Postgres (nil: no such SKU).
func (l *loaders) product() *dataloadgen.Loader[string, *inventory.Product] {
	l.productOnce.Do(func() { l.productL = batched("products", l.engine.Catalog().ProductsBySKU) })
	return l.productL
}

// drop loads drops, with their SKUs, from Postgres (nil: no such drop).
func (l *loaders) drop() *dataloadgen.Loader[string, *inventory.Drop] {
	l.dropOnce.Do(func() { l.dropL = batched("drops", l.engine.Drops().DropsByID) })
	return l.dropL
}

// draw loads products' draws from Postgres (nil: not sold by draw).
func (l *loaders) draw() *dataloadgen.Loader[string, *inventory.Draw] {
	l.drawOnce.Do(func() { l.drawL = batched("draws", l.engine.Draws().DrawsOf) })
	return l.drawL
}

// batched is a loader over one of the engine's batch reads, which answer
// every key in one call (a nil entry for a key that names nothing).
func batched[V any](what string, read func(context.Context, []string) ([]*V, error)) *dataloadgen.Loader[string, *V] {
	return dataloadgen.NewLoader(func(ctx context.Context, keys []string) ([]*V, []error) {
		out, err := read(ctx, keys)
		if err != nil {
			return nil, []error{fmt.Errorf("loading %s: %w", what, err)}
		}
		return out, nil
	}, dataloadgen.WithWait(loaderWait))
}

func loadersFrom(ctx context.Context) *loaders {
	l, _ := ctx.Value(loadersKey{}).(*loaders)
	return l
}

// prefetchPage asks the loaders for a whole page at once: its SKUs' stock,
// their draws and their drops, each when the page selects
// edges { node { stock | draw | drop } }. Each kind of read is then one
// batch (one pipelined round trip, one PostgreSQL statement), however long
// gqlgen takes to reach each node's field: on a loaded machine, or under
// the race detector, longer than loaderWait, which would split the page's
// reads into several batches. The nodes' own loads find the keys already
// asked for.
func prefetchPage(ctx context.Context, page []inventory.Product) {
	l := loadersFrom(ctx)
	if l == nil || len(page) == 0 {
		return
	}
	types := [][]string{{"ProductConnection"}, {"ProductEdge"}, {"Product", "Node"}}
	skus := make([]string, len(page))
	var drops []string
	for i, p := range page {
		skus[i] = p.SKU
		if p.Drop != "" {
			drops = append(drops, p.Drop)
		}
	}
	if selects(ctx, []string{"edges", "node", "stock"}, types) {
		l.stock().LoadAllThunk(ctx, skus)
	}
	if selects(ctx, []string{"edges", "node", "draw"}, types) {
		l.draw().LoadAllThunk(ctx, skus)
	}
	if len(drops) > 0 && selects(ctx, []string{"edges", "node", "drop"}, types) {
		l.drop().LoadAllThunk(ctx, drops)
	}
}

// selects says whether the field being resolved selects path below it,
// each step's selection read as the types in satisfies[i].
func selects(ctx context.Context, path []string, satisfies [][]string) bool {
	if !graphql.HasOperationContext(ctx) || graphql.GetFieldContext(ctx) == nil {
		return false
	}
	op := graphql.GetOperationContext(ctx)
	fields := graphql.CollectFieldsCtx(ctx, satisfies[0])
	for i, name := range path {
		var next []graphql.CollectedField
		found := false
		for _, f := range fields {
			if f.Name != name {
				continue
			}
			found = true
			if i+1 < len(path) {
				next = append(next, graphql.CollectFields(op, f.Selections, satisfies[i+1])...)
			}
		}
		if !found {
			return false
		}
		fields = next
	}
	return true
}

// load is l.Load(ctx, key), the request's slot of the gate given back while
// the loader gathers keys and reads (cpugate.Pause).
func load[V any](ctx context.Context, l *dataloadgen.Loader[string, V], key string) (V, error) {
	defer cpugate.Pause(ctx)()
	return l.Load(ctx, key)
}

// loadAll is l.LoadAll(ctx, keys), as load.
func loadAll[V any](ctx context.Context, l *dataloadgen.Loader[string, V], keys []string) ([]V, error) {
	defer cpugate.Pause(ctx)()
	return l.LoadAll(ctx, keys)
}
