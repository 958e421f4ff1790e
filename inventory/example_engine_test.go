package inventory_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// exampleEngine builds an engine on a throwaway database and key prefix. A
// real program passes its own pool and client, and the prefix "dl:".
func exampleEngine(ctx context.Context) (*inventory.Engine, func()) {
	url, drop, err := testenv.CreateDatabase()
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	opts, err := redis.ParseURL(envOr("REDIS_URL", testenv.DefaultRedisURL))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	prefix := fmt.Sprintf("example%d:", os.Getpid())
	engine, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: prefix}, rdb, pool, zerolog.Nop())
	if err != nil {
		panic(err)
	}
	return engine, func() {
		keys, _ := rdb.Keys(ctx, prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
		_ = rdb.Close()
		pool.Close()
		drop()
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// A drop of two units: the first buyer holds both and commits, the second is
// told how many are left.
func ExampleEngine_Reserve() {
	ctx := context.Background()
	engine, done := exampleEngine(ctx)
	defer done()

	admin := inventory.Principal{ID: "ops", Admin: true}
	_, err := engine.Catalog().CreateProduct(ctx, admin, inventory.ProductInput{
		SKU: "SNEAKER-42", Name: "Limited sneaker", Price: inventory.Money{Amount: 18000, Currency: "EUR"}, Stock: 2,
	})
	if err != nil {
		panic(err)
	}

	alice := inventory.Principal{ID: "alice"}
	hold, err := engine.Reserve(ctx, alice, inventory.ReserveRequest{SKU: "SNEAKER-42", Quantity: 2, IdempotencyKey: "cart-1"})
	fmt.Println(hold.Status, hold.Quantity, err)

	_, err = engine.Reserve(ctx, inventory.Principal{ID: "bob"}, inventory.ReserveRequest{SKU: "SNEAKER-42", Quantity: 1})
	var oos *inventory.OutOfStockError
	fmt.Println(errors.As(err, &oos), oos.Available, inventory.ErrorCode(err))

	sale, err := engine.Commit(ctx, alice, hold.Token)
	fmt.Println(sale.Status, err)

	stock, _ := engine.Catalog().Stock(ctx, "SNEAKER-42")
	fmt.Printf("available %d, held %d, sold %d of %d\n", stock.Available, stock.Held, stock.Sold, stock.Total)
	// Output:
	// HELD 2 <nil>
	// true 0 OUT_OF_STOCK
	// COMMITTED <nil>
	// available 0, held 0, sold 2 of 2
}
