package resolvers

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

// reserveFailed puts a business outcome into the payload, or returns a real
// failure to the error presenter.
func (r *mutationResolver) reserveFailed(out *model.ReservePayload, err error) (*model.ReservePayload, error) {
	ue, err := userError(err)
	if err != nil {
		return nil, err
	}
	out.UserErrors = append(out.UserErrors, ue)
	return out, nil
}

// holdMutation runs a mutation on an existing hold (commit, cancel) for the
// calling principal and maps its outcome: the reservation, or the business
// outcome as a user error; only a real failure is returned as an error.
func (r *mutationResolver) holdMutation(ctx context.Context, call func(inventory.Principal) (inventory.Reservation, error)) (*model.Reservation, []*model.UserError, error) {
	p, refused := r.deps.mutationCaller(ctx)
	if refused != nil {
		return nil, []*model.UserError{refused}, nil
	}
	res, err := call(p)
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, nil, err
		}
		return nil, []*model.UserError{ue}, nil
	}
	return reservationModel(res), []*model.UserError{}, nil
}

// cartMutation runs a cart mutation for the calling principal and maps its
// outcome: the cart, or its refusals as userErrors (one per refused line).
func (r *mutationResolver) cartMutation(ctx context.Context, call func(inventory.Principal) (inventory.Cart, error)) (*model.CartPayload, error) {
	p, refused := r.deps.mutationCaller(ctx)
	if refused != nil {
		return &model.CartPayload{UserErrors: []*model.UserError{refused}}, nil
	}
	return cartPayload(call(p))
}

// cartPayload maps a cart, or why there is none, to its payload. A refused
// cart gives each refused line its own userError, whose field names the
// line and whose available says what it could have had.
func cartPayload(c inventory.Cart, err error) (*model.CartPayload, error) {
	if err == nil {
		return &model.CartPayload{Cart: cartModel(c), UserErrors: []*model.UserError{}}, nil
	}
	var refused *inventory.CartRefusedError
	if !errors.As(err, &refused) {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return &model.CartPayload{UserErrors: []*model.UserError{ue}}, nil
	}
	out := &model.CartPayload{UserErrors: []*model.UserError{}}
	for _, l := range refused.Lines {
		ue, err := userError(l.Err)
		if err != nil {
			return nil, err
		}
		field := "quantity"
		var (
			sna *inventory.SaleNotActiveError
			nf  *inventory.NotFoundError
		)
		if errors.As(l.Err, &sna) || errors.As(l.Err, &nf) {
			field = "sku"
		}
		ue.Field = []string{"input", "lines", strconv.Itoa(l.Index), field}
		available := l.Available()
		ue.Available = &available
		out.UserErrors = append(out.UserErrors, ue)
	}
	return out, nil
}

func productRefused(ue *model.UserError) *model.ProductPayload {
	return &model.ProductPayload{UserErrors: []*model.UserError{ue}}
}

// productResult maps an admin mutation's outcome to its payload.
func productResult(p inventory.Product, err error) (*model.ProductPayload, error) {
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return productRefused(ue), nil
	}
	return &model.ProductPayload{Product: productModel(p), UserErrors: []*model.UserError{}}, nil
}

// clearableTime maps an omittable time to the engine's convention: nil
// leaves it, a pointer to the zero time clears it.
func clearableTime(v *time.Time, set bool) *time.Time {
	switch {
	case !set:
		return nil
	case v == nil:
		return &time.Time{}
	}
	return v
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
