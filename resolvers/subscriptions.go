package resolvers

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/live"
)

// Codes of subscription refusals.
const (
	// CodeTooManySubscriptions: the connection has SubscriptionsPerConn
	// operations in flight (subscriptions, and over a websocket queries
	// and mutations until they are answered).
	CodeTooManySubscriptions = "TOO_MANY_SUBSCRIPTIONS"
)

// CodeUnavailable refuses a subscription when live updates are not running
// here (or stopped): the engine's outcome of a store out of reach.
var CodeUnavailable = string(inventory.ErrUnavailable.Code())

// Subscription field names, as metric labels.
const (
	fieldStockChanged       = "stockChanged"
	fieldReservationChanged = "reservationChanged"
	fieldQueueChanged       = "queueChanged"
)

var errLiveUnavailable = &apiError{code: CodeUnavailable, message: "live updates are not available on this server"}

// ErrTooManyOperations refuses an operation over its connection's cap on
// operations in flight (Stream.AdmitOperation): a subscription its
// resolver refuses, or any operation a websocket refuses before it runs
// (the error presenter gives it its code).
var ErrTooManyOperations error = &apiError{code: CodeTooManySubscriptions, message: "too many operations in flight on this connection"}

// subscription is the bookkeeping every subscription resolver shares: the
// per-connection cap, the active gauge, and how the stream ended.
type subscription struct {
	d       *deps
	field   string
	release func()
	stream  Stream // nil outside a stream transport
	shared  bool   // executed for many members, who are counted instead
}

// admit counts a new subscription of field against its connection's cap.
func (d *deps) admit(ctx context.Context, field string) (*subscription, error) {
	if d.hub == nil {
		return nil, errLiveUnavailable
	}
	st := StreamFrom(ctx)
	release := func() {}
	if st != nil {
		var ok bool
		if release, ok = st.AdmitOperation(); !ok {
			return nil, ErrTooManyOperations
		}
	}
	shared := stockObserverFrom(ctx) != nil
	if !shared {
		d.sm.active.WithLabelValues(field).Inc()
	}
	return &subscription{d: d, field: field, release: release, stream: st, shared: shared}, nil
}

// done ends the bookkeeping; reason is a metric label.
func (s *subscription) done(reason string) {
	s.release()
	if s.shared {
		return
	}
	s.d.sm.active.WithLabelValues(s.field).Dec()
	s.d.sm.ended.WithLabelValues(s.field, reason).Inc()
}

// SubscriptionStarted counts one member of a shared subscription of field
// (see StockObserver): sent counts a payload written to it, done ends it
// with a reason label (client, complete, dropped).
func (r *Resolver) SubscriptionStarted(field string) (sent func(), done func(reason string)) {
	sm := r.deps.sm
	sm.active.WithLabelValues(field).Inc()
	counter := sm.sent.WithLabelValues(field)
	return counter.Inc, func(reason string) {
		sm.active.WithLabelValues(field).Dec()
		sm.ended.WithLabelValues(field, reason).Inc()
	}
}

// send hands v to the transport, or gives up when the client went away.
func send[T any](ctx context.Context, s *subscription, out chan<- T, v T) bool {
	select {
	case out <- v:
		if !s.shared {
			s.d.sm.sent.WithLabelValues(s.field).Inc()
		}
		return true
	case <-ctx.Done():
		return false
	}
}

// dropped tells a websocket client that its live feed ended without its
// asking (it fell behind for too long, or the server is shutting down),
// as an error message rather than a "complete" it would take for a normal
// end. SSE has no such message: its stream just completes.
// awaitChange waits until the SKU's feed wakes a re-reading stream or its
// recheck ticks. It reports false, having ended the subscription, when the
// client left or the hub dropped the feed.
func awaitChange(ctx context.Context, s *subscription, wake <-chan inventory.Stock, tick <-chan time.Time) bool {
	select {
	case _, ok := <-wake:
		if !ok {
			if ctx.Err() == nil {
				s.dropped(ctx)
				s.done("dropped")
			} else {
				s.done("client")
			}
			return false
		}
	case <-tick:
	case <-ctx.Done():
		s.done("client")
		return false
	}
	return true
}

func (s *subscription) dropped(ctx context.Context) {
	if o := stockObserverFrom(ctx); o != nil && (s.field == fieldStockChanged || s.field == fieldQueueChanged) {
		o.StockDropped()
	}
	if s.stream != nil && s.stream.Websocket() {
		s.stream.SubscriptionError(ctx, LiveDroppedError())
	}
}

// LiveDroppedError is what a websocket subscription ends with when its live
// feed stopped without the client asking (SSE has no such message).
func LiveDroppedError() *gqlerror.Error {
	return &gqlerror.Error{
		Message:    "live updates stopped: the client fell behind or the server is shutting down; subscribe again",
		Extensions: map[string]any{"code": CodeUnavailable},
	}
}

// liveError maps the hub's refusals to API errors.
func liveError(err error) error {
	if errors.Is(err, live.ErrNotRunning) {
		return errLiveUnavailable
	}
	return queryError(err)
}

// stockChanged forwards the hub's values for skus, converted to the API
// model, at the transport's pace. The hub never waits for this goroutine:
// it keeps only the newest value per SKU until it is taken.
func (d *deps) stockChanged(ctx context.Context, skus []string) (<-chan *model.Stock, error) {
	s, err := d.admit(ctx, fieldStockChanged)
	if err != nil {
		return nil, err
	}
	in, err := d.hub.Subscribe(ctx, skus)
	if err != nil {
		s.done("refused")
		return nil, liveError(err)
	}
	return forward(ctx, s, in, func(v inventory.Stock) string { return v.SKU }, stockModel), nil
}

// forward sends what the hub delivers on in, converted by toModel, at the
// transport's pace, telling the context's observer (if any) the key of
// each value; it ends the subscription when the hub drops it or the
// client goes.
func forward[V, M any](ctx context.Context, s *subscription, in <-chan V, key func(V) string, toModel func(V) M) <-chan M {
	out := make(chan M)
	obs := stockObserverFrom(ctx)
	go func() {
		defer close(out)
		for {
			select {
			case v, ok := <-in:
				if !ok {
					if ctx.Err() == nil {
						s.dropped(ctx)
						s.done("dropped")
					} else {
						s.done("client")
					}
					return
				}
				if obs != nil {
					obs.StockObserved(key(v))
				}
				if !send(ctx, s, out, toModel(v)) {
					s.done("client")
					return
				}
			case <-ctx.Done():
				s.done("client")
				return
			}
		}
	}()
	return out
}

// reservationChanged watches one reservation. There is no channel per
// reservation: every change of a hold (reserve, commit, cancel, expiry)
// changes its SKU's stock, so the reservation is re-read whenever the
// SKU's stock moves, and every ReservationRecheck in case a stock message
// was coalesced away or lost. Only changes are sent; the stream completes
// after a final status has been delivered.
func (d *deps) reservationChanged(ctx context.Context, token string) (<-chan *model.Reservation, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	if d.hub == nil {
		return nil, errLiveUnavailable
	}
	first, err := d.engine.Reservation(ctx, p, token)
	if err != nil {
		if code := inventory.ErrorCode(err); code == inventory.ErrInvalidInput.Code() || code == inventory.ErrNotFound.Code() {
			return nil, &apiError{code: string(inventory.ErrNotFound.Code()), message: inventory.ErrorMessage(inventory.ErrNotFound)}
		}
		return nil, queryError(err)
	}
	s, err := d.admit(ctx, fieldReservationChanged)
	if err != nil {
		return nil, err
	}
	// The stock subscription is only a wake-up call; it ends with ours.
	subCtx, cancel := context.WithCancel(ctx)
	var wake <-chan inventory.Stock
	if !finalStatus(first.Status) {
		if wake, err = d.hub.Subscribe(subCtx, []string{first.SKU}); err != nil {
			cancel()
			s.done("refused")
			return nil, liveError(err)
		}
	}
	out := make(chan *model.Reservation)
	go func() {
		defer cancel()
		defer close(out)
		last := first
		if !send(ctx, s, out, reservationModel(last)) {
			s.done("client")
			return
		}
		if finalStatus(last.Status) {
			s.done("complete")
			return
		}
		tick := time.NewTicker(d.recheck)
		defer tick.Stop()
		for {
			if !awaitChange(ctx, s, wake, tick.C) {
				return
			}
			cur, err := d.rereadReservation(ctx, p, token)
			if err != nil {
				if ctx.Err() != nil {
					s.done("client")
					return
				}
				zerolog.Ctx(ctx).Warn().Err(err).Msg("re-reading a watched reservation (retried)")
				continue
			}
			if sameReservation(last, cur) {
				continue
			}
			last = cur
			if !send(ctx, s, out, reservationModel(last)) {
				s.done("client")
				return
			}
			if finalStatus(last.Status) {
				s.done("complete")
				return
			}
		}
	}()
	return out, nil
}

// rereadTimeout bounds one re-read of a watched reservation.
const rereadTimeout = 3 * time.Second

func (d *deps) rereadReservation(ctx context.Context, p inventory.Principal, token string) (inventory.Reservation, error) {
	ctx, cancel := context.WithTimeout(ctx, rereadTimeout)
	defer cancel()
	return d.engine.Reservation(ctx, p, token)
}

// sameReservation compares what the API shows of a reservation.
func sameReservation(a, b inventory.Reservation) bool {
	return reflect.DeepEqual(reservationModel(a), reservationModel(b))
}

// finalStatus reports whether a reservation can no longer change.
func finalStatus(s inventory.Status) bool {
	return s == inventory.StatusCommitted || s == inventory.StatusCancelled || s == inventory.StatusExpired
}

// queueChanged forwards the hub's states of one queue: the same value for
// every waiter (each works its position out from its own number), so the
// GraphQL layer shares one execution among identical subscriptions.
func (d *deps) queueChanged(ctx context.Context, sku, drop *string) (<-chan *model.Queue, error) {
	ref, err := queueRef(sku, drop)
	if err != nil {
		return nil, queryError(err)
	}
	s, err := d.admit(ctx, fieldQueueChanged)
	if err != nil {
		return nil, err
	}
	in, err := d.hub.SubscribeQueue(ctx, ref)
	if err != nil {
		s.done("refused")
		return nil, liveError(err)
	}
	return forward(ctx, s, in, func(v queue.State) string { return v.Ref.String() }, queueModel), nil
}
