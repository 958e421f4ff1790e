package resolvers

import (
	"context"
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
