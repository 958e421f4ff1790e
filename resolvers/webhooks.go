package resolvers

import (
	"context"
	"strconv"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/webhook"
)

// The webhook admin API: each resolver parses its input, calls one method
// of webhook.Service and maps the result. Mutations spend the caller's
// mutation budget like any other.

func (d *deps) createWebhookEndpoint(ctx context.Context, in model.CreateWebhookEndpointInput) (*model.WebhookEndpointPayload, error) {
	p, refused := d.mutationCaller(ctx)
	if refused != nil {
		return webhookEndpointRefused(refused), nil
	}
	e, err := d.hooks.CreateEndpoint(ctx, p, webhook.EndpointInput{
		URL: in.URL, Secret: deref(in.Secret), EventTypes: in.EventTypes, Description: deref(in.Description), Enabled: in.Enabled,
	})
	return webhookEndpointResult(e, err)
}

func (d *deps) updateWebhookEndpoint(ctx context.Context, in model.UpdateWebhookEndpointInput) (*model.WebhookEndpointPayload, error) {
	p, refused := d.mutationCaller(ctx)
	if refused != nil {
		return webhookEndpointRefused(refused), nil
	}
	e, err := d.hooks.UpdateEndpoint(ctx, p, in.ID, webhook.EndpointUpdate{
		URL: in.URL, Secret: in.Secret, EventTypes: in.EventTypes, Description: in.Description, Enabled: in.Enabled,
	})
	return webhookEndpointResult(e, err)
}

func (d *deps) deleteWebhookEndpoint(ctx context.Context, in model.DeleteWebhookEndpointInput) (*model.WebhookEndpointPayload, error) {
	p, refused := d.mutationCaller(ctx)
	if refused != nil {
		return webhookEndpointRefused(refused), nil
	}
	e, err := d.hooks.DeleteEndpoint(ctx, p, in.ID)
	return webhookEndpointResult(e, err)
}

func (d *deps) redeliverWebhooks(ctx context.Context, in model.RedeliverWebhooksInput) (*model.RedeliverWebhooksPayload, error) {
	p, refused := d.mutationCaller(ctx)
	if refused != nil {
		return &model.RedeliverWebhooksPayload{UserErrors: []*model.UserError{refused}}, nil
	}
	n, err := d.hooks.Redeliver(ctx, p, in.EndpointID, in.WebhookIds)
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return &model.RedeliverWebhooksPayload{UserErrors: []*model.UserError{ue}}, nil
	}
	return &model.RedeliverWebhooksPayload{Redelivered: n, UserErrors: []*model.UserError{}}, nil
}

func (d *deps) webhookEndpoints(ctx context.Context) ([]*model.WebhookEndpoint, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	list, err := d.hooks.Endpoints(ctx, p)
	if err != nil {
		return nil, queryError(err)
	}
	out := make([]*model.WebhookEndpoint, len(list))
	for i, e := range list {
		out[i] = webhookEndpointModel(e)
	}
	return out, nil
}

func (d *deps) webhookDeliveries(ctx context.Context, endpoint string, status *model.WebhookDeliveryStatus, first *int, after *string) ([]*model.WebhookDelivery, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	limit, err := d.pageSize(first)
	if err != nil {
		return nil, err
	}
	st := model.WebhookDeliveryStatusDead
	if status != nil {
		st = *status
	}
	list, err := d.hooks.Deliveries(ctx, p, endpoint, string(st), deref(after), limit)
	if err != nil {
		return nil, queryError(err)
	}
	out := make([]*model.WebhookDelivery, len(list))
	for i, w := range list {
		out[i] = webhookDeliveryModel(w)
	}
	return out, nil
}

func webhookEndpointResult(e webhook.Endpoint, err error) (*model.WebhookEndpointPayload, error) {
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return webhookEndpointRefused(ue), nil
	}
	return &model.WebhookEndpointPayload{Endpoint: webhookEndpointModel(e), UserErrors: []*model.UserError{}}, nil
}

func webhookEndpointRefused(ue *model.UserError) *model.WebhookEndpointPayload {
	return &model.WebhookEndpointPayload{UserErrors: []*model.UserError{ue}}
}

func webhookEndpointModel(e webhook.Endpoint) *model.WebhookEndpoint {
	return &model.WebhookEndpoint{
		ID: strconv.FormatInt(e.ID, 10), URL: e.URL, Secret: e.Secret, EventTypes: e.EventTypes,
		Description: e.Description, Enabled: e.Enabled, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt,
	}
}

func webhookDeliveryModel(w webhook.Delivery) *model.WebhookDelivery {
	m := &model.WebhookDelivery{
		WebhookID: webhook.MessageID(w.EventID), Type: w.Type, Sku: w.SKU, Payload: string(w.Payload),
		Status: model.WebhookDeliveryStatus(w.Status), Attempts: w.Attempts,
		LastAttemptAt: w.LastAttemptAt, DeliveredAt: w.DeliveredAt, RecordedAt: w.RecordedAt,
	}
	if w.Status == webhook.Pending {
		next := w.NextAttemptAt
		m.NextAttemptAt = &next
	}
	if w.LastStatus != 0 {
		status := w.LastStatus
		m.LastStatus = &status
	}
	if w.LastError != "" {
		msg := w.LastError
		m.LastError = &msg
	}
	return m
}
