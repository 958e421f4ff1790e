package resolvers

import (
	"context"
	"encoding/hex"
	"errors"
	"time"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
	"github.com/dropline/dropline/live"
)

// queueSettings is a QueueInput as the engine takes it.
func queueSettings(in *model.QueueInput) *inventory.QueueSettings {
	if in == nil {
		return nil
	}
	return &inventory.QueueSettings{OpensAt: in.OpensAt, AdmitPerMinute: in.AdmitPerMinute,
		PassLife: time.Duration(deref(in.PassSeconds)) * time.Second, ProofOfWorkBits: deref(in.ProofOfWorkBits),
		AccessCodes: in.AccessCodes}
}

// queueRef names the queue of a product or a drop: exactly one of them.
func queueRef(sku, drop *string) (queue.Ref, error) {
	switch {
	case sku != nil && drop == nil && inventory.ValidSKU(*sku):
		return queue.Ref{Kind: queue.OfProduct, ID: *sku}, nil
	case drop != nil && sku == nil && inventory.ValidSKU(*drop):
		return queue.Ref{Kind: queue.OfDrop, ID: *drop}, nil
	}
	return queue.Ref{}, &inventory.InvalidInputError{Field: "sku", Reason: "give one valid sku or drop"}
}

func queueModel(st queue.State) *model.Queue {
	out := &model.Queue{ID: st.Ref.String(), Status: model.QueueStatus(st.Status), OpensAt: st.OpensAt,
		AdmittedThrough: int(st.AdmittedThrough), Waiting: int(st.Waiting), AdmitPerMinute: st.AdmitPerMinute,
		SeedHash: st.SeedHash}
	if st.Seed != nil {
		s := hex.EncodeToString(st.Seed)
		out.Seed = &s
	}
	return out
}

// queueOf is a queue's state, for Product.queue and Drop.queue.
func (r *Resolver) queueOf(ctx context.Context, ref queue.Ref) (*model.Queue, error) {
	st, err := r.deps.queues.State(ctx, ref)
	if err != nil {
		return nil, queryError(err)
	}
	return queueModel(st), nil
}

// ticketModel is a ticket with its queue; pollAfterSeconds grows with the
// position (a waiter far back has nothing to learn every second).
func ticketModel(t queue.Ticket, st queue.State) *model.QueueTicket {
	out := &model.QueueTicket{Status: model.QueueTicketStatus(t.Status), PollAfterSeconds: 1, Queue: queueModel(st)}
	if t.Number > 0 {
		n := int(t.Number)
		out.Number = &n
	}
	if t.Status == queue.TicketWaiting {
		pos := int(t.Position)
		out.Position = &pos
		if st.AdmitPerMinute > 0 {
			eta := pos * 60 / st.AdmitPerMinute
			out.EtaSeconds = &eta
		}
		out.PollAfterSeconds = min(max(1, pos/max(1, st.AdmitPerMinute/60)/4), 30)
	}
	if t.Status == queue.TicketPreQueue {
		out.PollAfterSeconds = min(max(1, int(time.Until(st.OpensAt).Seconds())/2), 30)
	}
	if t.Pass != "" {
		p := t.Pass
		out.Pass = &p
	}
	if !t.PassExpiresAt.IsZero() {
		e := t.PassExpiresAt
		out.PassExpiresAt = &e
	}
	return out
}

func (r *Resolver) joinQueue(ctx context.Context, input model.JoinQueueInput) (*model.QueueTicketPayload, error) {
	out := &model.QueueTicketPayload{UserErrors: []*model.UserError{}}
	p, refused := r.deps.mutationCaller(ctx)
	if refused != nil {
		out.UserErrors = append(out.UserErrors, refused)
		return out, nil
	}
	fail := func(err error) (*model.QueueTicketPayload, error) {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		out.UserErrors = append(out.UserErrors, ue)
		return out, nil
	}
	ref, err := queueRef(input.Sku, input.Drop)
	if err != nil {
		return fail(err)
	}
	t, err := r.deps.queues.Join(ctx, p.ID, ref, queue.JoinInput{Challenge: deref(input.Challenge),
		Proof: deref(input.Proof), AccessCode: deref(input.AccessCode)})
	if err != nil {
		return fail(err)
	}
	if t.Number > 0 {
		r.deps.tickets.put(ref, p.ID, t.Number)
	}
	st, err := r.deps.queueState(ctx, ref)
	if err != nil {
		return fail(err)
	}
	out.Ticket = ticketModel(t, st)
	return out, nil
}

// queueState is a queue's state from the live hub's memory when it runs
// here (at most one admission step behind), else read from Redis.
func (d *deps) queueState(ctx context.Context, ref queue.Ref) (queue.State, error) {
	if d.hub != nil {
		st, err := d.hub.QueueState(ctx, ref)
		if !errors.Is(err, live.ErrNotRunning) {
			return st, err
		}
	}
	return d.queues.State(ctx, ref)
}

func (r *Resolver) myQueueTicket(ctx context.Context, sku, drop *string) (*model.QueueTicket, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	ref, err := queueRef(sku, drop)
	if err != nil {
		return nil, queryError(err)
	}
	// From memory while the ticket waits: the number this process saw and
	// the queue's state the hub keeps. Redis once the ticket may hold a pass.
	st, err := r.deps.queueState(ctx, ref)
	if err != nil {
		return nil, queryError(err)
	}
	if n, ok := r.deps.tickets.get(ref, p.ID); ok {
		if t, ok := waitingTicket(ref, n, st); ok {
			return ticketModel(t, st), nil
		}
	}
	t, found, err := r.deps.queues.MyTicket(ctx, p.ID, ref)
	if err != nil {
		return nil, queryError(err)
	}
	if !found {
		return nil, nil
	}
	if t.Number > 0 {
		r.deps.tickets.put(ref, p.ID, t.Number)
	}
	if t.AdmittedThrough > st.AdmittedThrough {
		st.AdmittedThrough = t.AdmittedThrough // Redis is ahead of the hub's last message
	}
	return ticketModel(t, st), nil
}

func (r *Resolver) queueChallenge(ctx context.Context, sku, drop *string) (*model.QueueChallenge, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	ref, err := queueRef(sku, drop)
	if err != nil {
		return nil, queryError(err)
	}
	c, err := r.deps.queues.Challenge(ctx, p.ID, ref)
	if err != nil {
		return nil, queryError(err)
	}
	return &model.QueueChallenge{Challenge: c.Challenge, Bits: c.Bits, ExpiresAt: c.ExpiresAt}, nil
}
