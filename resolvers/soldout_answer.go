package resolvers

import (
	"context"
	"errors"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

// KnownSoldOut reports whether the engine's sold-out memory vouches now
// that sku is sold out (inventory.Engine.KnownSoldOut): a hint, which
// spends nothing, for a transport deciding whether to try
// ReserveFromMemory.
func (r *Resolver) KnownSoldOut(sku string) bool { return r.deps.engine.KnownSoldOut(sku) }

// ReserveFromMemory is the reserve mutation's resolver for a request without
// an idempotency key, an admission pass or a hold length, answered only when
// the engine's sold-out memory answers it (inventory.Engine.ReserveFromMemory):
// the payload is then the one Reserve returns for that answer. ok is false
// when the caller has no principal or the memory does not answer; nothing
// was spent then, and the mutation must run as usual.
func (r *Resolver) ReserveFromMemory(ctx context.Context, sku string, quantity int) (out *model.ReservePayload, ok bool) {
	p, refused := r.deps.reserveCaller(ctx)
	if refused != nil {
		return nil, false
	}
	req := inventory.ReserveRequest{SKU: sku, Quantity: quantity, RateLimit: r.deps.limiter.budget(p.ID)}
	answered, err := r.deps.engine.ReserveFromMemory(p, req)
	if !answered || err == nil {
		return nil, false
	}
	if oos, ok := err.(*inventory.OutOfStockError); ok && oos.Available == 0 { //nolint:errorlint // the memory's own error, unwrapped; errors.As below for any other
		return soldOutPayload, true
	}
	if oos := (*inventory.OutOfStockError)(nil); errors.As(err, &oos) && oos.Available == 0 {
		return soldOutPayload, true
	}
	ue, err := userError(err)
	if err != nil {
		return nil, false
	}
	return &model.ReservePayload{UserErrors: []*model.UserError{ue}}, true
}

// soldOutPayload is the payload of the memory's refusal, nothing available
// (userError's answer), made once and shared by every refusal: its callers
// only write it out, and must not change it.
var soldOutPayload = func() *model.ReservePayload {
	ue, err := userError(&inventory.OutOfStockError{})
	if err != nil {
		panic(err)
	}
	return &model.ReservePayload{UserErrors: []*model.UserError{ue}}
}()
