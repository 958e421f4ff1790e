package app

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
	"github.com/dropline/dropline/worker"
)

// DefaultDeps is the production wiring of the domain packages into the App:
// the one place cmd/ and e2e/ get db/, inventory/, server/graphql/ and worker/ from.
func DefaultDeps() Deps {
	return Deps{
		Migrate:           db.Migrate,
		PendingMigrations: db.Pending,
		Build:             buildServices,
		SeedDemo:          seedDemo,
	}
}

func newEngine(ctx context.Context, in Infra) (*inventory.Engine, error) {
	return inventory.NewEngine(ctx, inventory.Config{
		KeyPrefix:   in.Config.KeyPrefix,
		DefaultHold: in.Config.HoldDefault,
		MaxHold:     in.Config.HoldMax,
		// The engine's zero is its default; the configuration's zero is none.
		MaxExtensions: cmp.Or(in.Config.HoldExtensions, -1),
		RejectionTTL:  in.Config.RejectionTTL,
		WaitReplicas:  in.Config.RedisWaitReplicas,
		WaitTimeout:   in.Config.RedisWaitTimeout,
		WaitlistMax:   in.Config.WaitlistMax,
		CartPause:     in.Config.TestCartPause,
		DrawPause:     in.Config.TestDrawPause,
		Registerer:    in.Registry,
		Tracer:        in.Tracer,
		SalePool:      in.SalePool,
	}, in.Redis, in.Postgres, in.Log.With().Str("component", "inventory").Logger())
}

func buildServices(ctx context.Context, in Infra) (Services, error) {
	engine, err := newEngine(ctx, in)
	if err != nil {
		return Services{}, err
	}
	group := worker.NewGroup(worker.GroupConfig{
		Options: worker.Options{LeaseTTL: in.Config.LeaseTTL, Tracer: in.Tracer},
		Webhooks: worker.WebhookDispatcherConfig{
			Timeout: in.Config.WebhookTimeout, Concurrency: in.Config.WebhookConcurrency, MaxAttempts: in.Config.WebhookMaxAttempts,
			MinBackoff: in.Config.WebhookBackoff, MaxBackoff: in.Config.WebhookBackoffMax,
			Retention: in.Config.WebhookRetention,
		},
	}, engine.Maintenance(), in.Redis, in.Log.With().Str("component", "worker").Logger(), in.Registry)
	hub := live.NewHub(live.HubConfig{Interval: in.Config.LiveInterval}, engine, in.Redis, in.Log, in.Registry)
	// A reserve of a SKU the hub knows is sold out is answered from memory.
	engine.RememberSoldOut(hub)
	var trusted *graphql.TrustedDocuments
	if path := in.Config.TrustedDocuments; path != "" {
		if trusted, err = graphql.LoadTrustedDocuments(path); err != nil {
			return Services{}, err
		}
		in.Log.Info().Str("manifest", path).Int("documents", trusted.Len()).Msg("running trusted documents only")
	}
	return Services{
		GraphQL: graphql.NewHandler(graphql.Config{
			Engine:           engine,
			Redis:            in.Redis,
			Verifier:         in.Issuer,
			QueueSecret:      queueSecret(in.Config.JWTKey()),
			Dev:              in.Config.Dev,
			CORSOrigins:      in.Config.AllowedOrigins(),
			Live:             hub,
			Registerer:       in.Registry,
			Streams:          in.Config.StreamLimits(),
			TrustedDocuments: trusted,
			Tracer:           in.Tracer,
			Subgraph:         in.Config.Subgraph,
			Limits: graphql.Limits{
				MutationRate:    in.Config.MutationRate,
				MutationBurst:   in.Config.MutationBurst,
				APQBytesPerAddr: int64(in.Config.APQBytesPerAddr),
				Complexity:      in.Config.CostLimit,
				CostRate:        in.Config.CostRate,
				CostBurst:       in.Config.CostBurst,
				ResponseBytes:   int64(in.Config.ResponseMaxBytes),
				GateSlots:       in.Config.GateSlots,
				GateWait:        in.Config.GateWait,
			},
		}),
		Checks:  []server.Check{{Name: "scripts", Fn: engine.Ping}},
		Live:    hub,
		Workers: group,
	}, nil
}

// demoDrawCloses is how long after seeding the demo draw takes entries, and
// demoQueueOpens when the queued drop opens: everyone who joins before is
// in its pre-queue.
const (
	demoDrawCloses = 5 * time.Minute
	demoQueueOpens = time.Minute
)

// demoPresale is the demo's presale drop, and demoPresaleCodes how many
// access codes it has: DEMO-PRESALE-01 and on, one per buyer.
const (
	demoPresale      = "PRESALE-TRAINERS"
	demoPresaleCodes = 20
)

func seedDemo(ctx context.Context, in Infra) error {
	engine, err := newEngine(ctx, in)
	if err != nil {
		return err
	}
	admin := inventory.Principal{ID: "seed", Admin: true}
	// The hot SKU's sale window opens now: a drop the quick start can try at once.
	now := time.Now().UTC()
	end := now.Add(30 * 24 * time.Hour)
	// A presale drop: two sizes of a trainer behind one queue, open from
	// the seeding on, that lets in buyers with an access code.
	if _, err := engine.Drops().Drop(ctx, demoPresale); errors.Is(err, inventory.ErrNotFound) {
		codes := make([]string, demoPresaleCodes)
		for i := range codes {
			codes[i] = fmt.Sprintf("DEMO-PRESALE-%02d", i+1)
		}
		if _, err := engine.Drops().CreateDrop(ctx, admin, inventory.DropInput{ID: demoPresale, Name: "Presale: trainers", MaxPerUser: 1,
			Queue: &inventory.QueueSettings{OpensAt: now, AdmitPerMinute: 30, ProofOfWorkBits: 14, AccessCodes: codes}}); err != nil {
			return fmt.Errorf("creating drop %s: %w", demoPresale, err)
		}
	} else if err != nil {
		return fmt.Errorf("looking up drop %s: %w", demoPresale, err)
	}
	// One product of each kind, so the demo shop shows every way Dropline
	// sells: a limited drop, plenty (for carts), a poster of two units that
	// sells out (its waitlist), a jacket sold by draw, drawn a few minutes
	// after `make run` seeds it, a hoodie behind an admission queue that
	// opens a minute after, and the presale's two sizes.
	for _, p := range []inventory.ProductInput{
		{SKU: "DROP-SNEAKER-01", Name: "Limited sneaker", Price: inventory.Money{Amount: 19900, Currency: "EUR"}, Stock: 20, MaxPerUser: 1, SaleStartsAt: &now, SaleEndsAt: &end},
		{SKU: "TEE-BLACK-M", Name: "Black tee (M)", Price: inventory.Money{Amount: 2500, Currency: "EUR"}, Stock: 500},
		{SKU: "CAP-LOGO", Name: "Logo cap", Price: inventory.Money{Amount: 1800, Currency: "EUR"}, Stock: 200},
		{SKU: "POSTER-SIGNED", Name: "Signed poster", Price: inventory.Money{Amount: 4500, Currency: "EUR"}, Stock: 2, MaxPerUser: 1},
		{SKU: "DRAW-JACKET", Name: "Jacket, by draw", Price: inventory.Money{Amount: 24900, Currency: "EUR"}, Stock: 3, MaxPerUser: 1,
			Draw: &inventory.DrawInput{ClosesAt: now.Add(demoDrawCloses), WinnerHold: 10 * time.Minute}},
		{SKU: "DROP-HOODIE", Name: "Hoodie, queued drop", Price: inventory.Money{Amount: 8900, Currency: "EUR"}, Stock: 10, MaxPerUser: 1,
			Queue: &inventory.QueueSettings{OpensAt: now.Add(demoQueueOpens), AdmitPerMinute: 6, ProofOfWorkBits: 14}},
		{SKU: "TRAINER-42", Name: "Trainers, size 42", Price: inventory.Money{Amount: 12900, Currency: "EUR"}, Stock: 5, Drop: demoPresale},
		{SKU: "TRAINER-43", Name: "Trainers, size 43", Price: inventory.Money{Amount: 12900, Currency: "EUR"}, Stock: 5, Drop: demoPresale},
	} {
		if _, err := engine.Catalog().Product(ctx, p.SKU); err == nil {
			continue
		} else if !errors.Is(err, inventory.ErrNotFound) {
			return fmt.Errorf("looking up %s: %w", p.SKU, err)
		}
		if _, err := engine.Catalog().CreateProduct(ctx, admin, p); err != nil {
			return fmt.Errorf("creating %s: %w", p.SKU, err)
		}
	}
	return nil
}

// queueSecret is the key that signs the admission queues' challenges: the
// JWT secret, hashed with a purpose of its own, so one key never signs two
// kinds of thing.
func queueSecret(jwt []byte) []byte {
	m := hmac.New(sha256.New, jwt)
	m.Write([]byte("dropline admission queue challenges"))
	return m.Sum(nil)
}
