package resolvers

import (
	"context"
	"strconv"
	"time"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/webhook"
)

// deps are the resolvers' injected collaborators.
type deps struct {
	engine  *inventory.Engine
	limits  Limits
	limiter *mutationLimiter
	hub     *live.Hub     // nil: subscriptions answer UNAVAILABLE
	recheck time.Duration // how often reservationChanged re-reads
	sm      *subscriptionMetrics
	hooks   *webhook.Service // the webhook endpoints and their deliveries
	queues  *queue.Service   // the admission queues
	tickets *ticketNumbers   // principals' ticket numbers seen here
}

// principal returns the verified caller of a query, or false for an
// anonymous one. A bad token never gets here: auth.Middleware refused it
// with 401.
func principal(ctx context.Context) (inventory.Principal, bool) {
	p, ok := auth.PrincipalFrom(ctx)
	if !ok {
		return inventory.Principal{}, false
	}
	return inventory.Principal{ID: p.ID, Admin: p.Admin}, true
}

// mutationCaller admits a mutation: it needs a verified principal and a
// unit of that principal's rate budget. A refusal is a userError.
func (d *deps) mutationCaller(ctx context.Context) (inventory.Principal, *model.UserError) {
	p, refused := d.reserveCaller(ctx)
	if refused != nil {
		return p, refused
	}
	if allowed, retry := d.limiter.allow(ctx, p.ID); !allowed {
		return inventory.Principal{}, rateLimitedError(retry)
	}
	return p, nil
}

// reserveCaller is mutationCaller without the budget: a reserve spends it
// in the engine (inventory.ReserveRequest.RateLimit), in the same Redis
// script run as the reserve itself.
func (d *deps) reserveCaller(ctx context.Context) (inventory.Principal, *model.UserError) {
	p, ok := principal(ctx)
	if !ok {
		return inventory.Principal{}, &model.UserError{Code: model.ErrorCodeUnauthenticated, Message: unauthenticatedMessage}
	}
	return p, nil
}

// pageSize checks a connection's `first`.
func (d *deps) pageSize(first *int) (int, error) {
	if first == nil {
		return d.limits.PageSize, nil
	}
	if *first < 1 || *first > d.limits.MaxPageSize {
		return 0, queryError(&inventory.InvalidInputError{Field: "first", Reason: "must be between 1 and " + strconv.Itoa(d.limits.MaxPageSize)})
	}
	return *first, nil
}
