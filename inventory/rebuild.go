package inventory

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/lua"
)

// Rebuild loads a SKU into Redis from Postgres when Redis does not have it (a
// new product, or state lost to a restart, flush or failover). It is a no-op
// when the SKU is present. Concurrent calls in this process share one rebuild;
// across processes the script's existence check lets only the first write.
//
// The snapshot is read under the product's Postgres row lock and written to
// Redis before the lock is released, so no commit lands between the two.
// Restored: the total and sold counts, holds Postgres has as HELD and not yet
// due (oldest first, while they fit in total - sold; the rest are recorded as
// expired), sales of the retention window (so a repeated commit replays),
// cancelled and expired reservations of the idempotency window (so their key
// replays them), and each principal's quota count. Holds that never reached Postgres are lost
// with Redis, and their units return to stock.
func (e *Engine) Rebuild(ctx context.Context, sku string) error {
	_, err, _ := e.rebuild.Do(sku, func() (any, error) {
		// Detach from the first caller's cancellation: others wait on this.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, e.rebuildOnce(ctx, sku)
	})
	return err
}

func (e *Engine) rebuildOnce(ctx context.Context, sku string) error {
	if n, err := e.rdb.Exists(ctx, e.keys.SKU(sku)).Result(); err != nil {
		return unavailable("rebuilding "+sku, err)
	} else if n == 1 {
		return nil
	}
	var result string
	err := e.ledger.WithSnapshot(ctx, sku, e.cfg.Retention, e.cfg.IdempotencyTTL, func(s db.Snapshot) error {
		args, err := e.hydrateArgs(ctx, s)
		if err != nil {
			return err
		}
		r, err := e.run(ctx, lua.HydrateSKU, []string{e.keys.SKU(sku)}, args...)
		if err != nil {
			return err
		}
		result = reply(r).code()
		return nil
	})
	switch {
	case errors.Is(err, db.ErrNotFound):
		return productNotFound(sku)
	case errors.Is(err, ErrUnavailable):
		return err
	case err != nil:
		return unavailable("rebuilding "+sku, err)
	}
	if result == "OK" {
		e.metrics.rebuilds.Inc()
		e.log.Info().Str("sku", sku).Msg("rebuilt SKU in Redis from Postgres")
	}
	return nil
}

// statusDrop marks, for hydrate_sku.lua, a hold Postgres still has as HELD
// that is past due or no longer fits the stock: it is recorded as expired.
const statusDrop = "DROP"

// hydrateArgs lays out the snapshot as hydrate_sku.lua's arguments.
func (e *Engine) hydrateArgs(ctx context.Context, s db.Snapshot) ([]any, error) {
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return nil, unavailable("reading Redis time", err)
	}
	p := s.Product
	room := p.Total - p.Sold
	held := 0
	quota := map[string]int{}
	for who, n := range s.Bought {
		quota[who] = n
	}
	type hold struct {
		r      db.Reservation
		status string
	}
	var holds []hold
	for _, r := range s.Held {
		status := db.StatusHeld
		if !r.ExpiresAt.After(now) || r.Quantity > room-held {
			status = statusDrop // recorded as expired now, with its event
		} else {
			held += r.Quantity
			quota[r.Principal] += r.Quantity
		}
		holds = append(holds, hold{r, status})
	}
	for _, r := range s.Committed {
		holds = append(holds, hold{r, db.StatusCommitted})
	}
	for _, r := range s.Finished {
		holds = append(holds, hold{r, r.Status})
	}
	args := []any{
		e.keys.Base(PartitionOf(p.SKU)), p.SKU, p.Total, p.Sold, p.MaxPerUser,
		timeMs(p.SaleStartsAt), timeMs(p.SaleEndsAt), p.Version,
		int64(e.cfg.Retention.Seconds()), int64(e.cfg.IdempotencyTTL.Seconds()),
		held, room - held, len(holds),
	}
	for _, h := range holds {
		ended := timeMs(h.r.EndedAt)
		if h.status == statusDrop {
			ended = now.UnixMilli()
		}
		args = append(args, h.r.Token, h.r.Principal, h.r.Quantity, h.status, h.r.ExpiresAt.UnixMilli(),
			h.r.CreatedAt.UnixMilli(), timeMs(h.r.CommittedAt), ended, h.r.IdempotencyHash, h.r.RequestHash)
	}
	principals := make([]string, 0, len(quota))
	for who := range quota {
		principals = append(principals, who)
	}
	sort.Strings(principals)
	args = append(args, len(principals))
	for _, who := range principals {
		args = append(args, who, quota[who])
	}
	if len(args) > 1_000_000 {
		return nil, fmt.Errorf("rebuilding %s: snapshot too large for one script (%d arguments)", p.SKU, len(args))
	}
	return args, nil
}
