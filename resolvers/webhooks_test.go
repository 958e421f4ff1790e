package resolvers_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/webhook"
)

const webhookEndpointFields = `id url secret eventTypes description enabled createdAt updatedAt`

const (
	createWebhookDoc = `mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) {
		endpoint { ` + webhookEndpointFields + ` } ` + userErrorFields + ` } }`
	updateWebhookDoc = `mutation($i: UpdateWebhookEndpointInput!) { updateWebhookEndpoint(input: $i) {
		endpoint { ` + webhookEndpointFields + ` } ` + userErrorFields + ` } }`
	deleteWebhookDoc = `mutation($i: DeleteWebhookEndpointInput!) { deleteWebhookEndpoint(input: $i) {
		endpoint { id } ` + userErrorFields + ` } }`
	redeliverDoc = `mutation($i: RedeliverWebhooksInput!) { redeliverWebhooks(input: $i) {
		redelivered ` + userErrorFields + ` } }`
	endpointsDoc  = `{ webhookEndpoints { ` + webhookEndpointFields + ` } }`
	deliveriesDoc = `query($e: ID!, $s: WebhookDeliveryStatus) { webhookDeliveries(endpointId: $e, status: $s) {
		webhookId type sku payload status attempts nextAttemptAt lastAttemptAt lastStatus lastError deliveredAt recordedAt } }`
)

type webhookEndpoint struct {
	ID, URL, Secret, Description string
	EventTypes                   []string
	Enabled                      bool
}

type webhookEndpointPayload struct {
	Endpoint   *webhookEndpoint
	UserErrors []struct {
		Code    string
		Field   []string
		Message string
	}
}

// TestWebhookEndpointsOverGraphQL: an admin subscribes, changes, lists and
// removes endpoints; a sale then waits for the endpoint as a pending
// delivery of exactly the recorded body; buyers and bad input are refused
// with typed userErrors and change nothing.
func TestWebhookEndpointsOverGraphQL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin, alice := e.Token(t, "admin", true), e.Token(t, "alice", false)

	var created struct{ CreateWebhookEndpoint webhookEndpointPayload }
	e.MustDo(t, admin, createWebhookDoc, map[string]any{"i": map[string]any{
		"url": "https://shop.example/hooks", "eventTypes": []string{"sale.committed", "product.sold_out", "sale.committed"},
		"description": "fulfilment"}}, &created)
	require.Empty(t, created.CreateWebhookEndpoint.UserErrors)
	ep := created.CreateWebhookEndpoint.Endpoint
	require.Equal(t, []string{"sale.committed", "product.sold_out"}, ep.EventTypes)
	require.True(t, ep.Enabled)
	require.NoError(t, webhook.ValidSecret(ep.Secret), "a fresh secret is made")

	for _, c := range []struct {
		in    map[string]any
		field string
	}{
		{map[string]any{"url": "ftp://shop.example/", "eventTypes": []string{"restock"}}, "url"},
		{map[string]any{"url": "https://user:pw@shop.example/", "eventTypes": []string{"restock"}}, "url"},
		{map[string]any{"url": "https://shop.example/", "eventTypes": []string{"sale.exploded"}}, "eventTypes"},
		{map[string]any{"url": "https://shop.example/", "eventTypes": []string{}}, "eventTypes"},
		{map[string]any{"url": "https://shop.example/", "eventTypes": []string{"restock"}, "secret": "hunter2"}, "secret"},
	} {
		var bad struct{ CreateWebhookEndpoint webhookEndpointPayload }
		e.MustDo(t, admin, createWebhookDoc, map[string]any{"i": c.in}, &bad)
		require.Nil(t, bad.CreateWebhookEndpoint.Endpoint)
		require.Len(t, bad.CreateWebhookEndpoint.UserErrors, 1)
		require.Equal(t, "INVALID_INPUT", bad.CreateWebhookEndpoint.UserErrors[0].Code, "%v", c.in)
		require.Contains(t, bad.CreateWebhookEndpoint.UserErrors[0].Message, c.field)
	}
	var refused struct{ CreateWebhookEndpoint webhookEndpointPayload }
	e.MustDo(t, alice, createWebhookDoc, map[string]any{"i": map[string]any{"url": "https://evil.example/", "eventTypes": []string{"sale.committed"}}}, &refused)
	require.Equal(t, "FORBIDDEN", refused.CreateWebhookEndpoint.UserErrors[0].Code)
	require.NotEmpty(t, e.Do(t, alice, endpointsDoc, nil, &struct{}{}), "a buyer cannot list endpoints")

	secret := webhook.NewSecret()
	var updated struct{ UpdateWebhookEndpoint webhookEndpointPayload }
	e.MustDo(t, admin, updateWebhookDoc, map[string]any{"i": map[string]any{"id": ep.ID, "secret": secret,
		"eventTypes": []string{"sale.committed", "restock"}}}, &updated)
	require.Empty(t, updated.UpdateWebhookEndpoint.UserErrors)
	require.Equal(t, secret, updated.UpdateWebhookEndpoint.Endpoint.Secret)
	require.Equal(t, "https://shop.example/hooks", updated.UpdateWebhookEndpoint.Endpoint.URL, "unchanged")
	var missing struct{ UpdateWebhookEndpoint webhookEndpointPayload }
	e.MustDo(t, admin, updateWebhookDoc, map[string]any{"i": map[string]any{"id": "999999", "enabled": false}}, &missing)
	require.Equal(t, "NOT_FOUND", missing.UpdateWebhookEndpoint.UserErrors[0].Code)

	var list struct{ WebhookEndpoints []webhookEndpoint }
	e.MustDo(t, admin, endpointsDoc, nil, &list)
	require.Len(t, list.WebhookEndpoints, 1)

	// A sale is recorded for the endpoint, with the body it will be sent.
	e.CreateProduct(t, map[string]any{"sku": "HOOK-1", "stock": 2})
	r := e.Reserve(t, alice, map[string]any{"sku": "HOOK-1", "quantity": 2})
	require.Empty(t, e.Commit(t, alice, r.Reservation.Token).UserErrors)
	var pending struct {
		WebhookDeliveries []struct {
			WebhookID, Type, Sku, Payload, Status string
			Attempts                              int
		}
	}
	e.MustDo(t, admin, deliveriesDoc, map[string]any{"e": ep.ID, "s": "PENDING"}, &pending)
	require.Len(t, pending.WebhookDeliveries, 1, "the sale; its sell-out is no longer subscribed")
	d := pending.WebhookDeliveries[0]
	require.Equal(t, "sale.committed", d.Type)
	var body struct {
		Type string
		Data struct {
			Token, Sku, Principal string
			Quantity              int
			Price                 struct{ Amount int }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(d.Payload), &body))
	require.Equal(t, "sale.committed", body.Type)
	require.Equal(t, r.Reservation.Token, body.Data.Token)
	require.Equal(t, "alice", body.Data.Principal)
	require.Equal(t, 2, body.Data.Quantity)
	require.Equal(t, 1999, body.Data.Price.Amount)

	var none struct{ RedeliverWebhooks struct{ Redelivered int } }
	e.MustDo(t, admin, redeliverDoc, map[string]any{"i": map[string]any{"endpointId": ep.ID}}, &none)
	require.Zero(t, none.RedeliverWebhooks.Redelivered, "no dead letters")

	var deleted struct{ DeleteWebhookEndpoint webhookEndpointPayload }
	e.MustDo(t, admin, deleteWebhookDoc, map[string]any{"i": map[string]any{"id": ep.ID}}, &deleted)
	require.Empty(t, deleted.DeleteWebhookEndpoint.UserErrors)
	e.MustDo(t, admin, endpointsDoc, nil, &list)
	require.Empty(t, list.WebhookEndpoints)
}
