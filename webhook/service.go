package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// Service is what admins do with webhooks: subscribe endpoints, change and
// remove them, look at what they were sent and could not be, and send it
// again. The sending itself is the worker group's (worker.WebhookDispatcher).
type Service struct {
	ledger *db.Ledger
}

// NewService wraps the ledger that holds the endpoints and the outbox.
func NewService(ledger *db.Ledger) *Service {
	return &Service{ledger: ledger}
}

// Endpoint is one subscriber, as the ledger keeps it.
type Endpoint = db.WebhookEndpoint

// Delivery is one event on its way to one endpoint, as the ledger keeps it.
type Delivery = db.WebhookDelivery

// The statuses of a delivery.
const (
	Pending   = db.WebhookPending
	Delivered = db.WebhookDelivered
	Dead      = db.WebhookDead
)

// MaxEndpoints is how many endpoints may exist.
const MaxEndpoints = db.MaxWebhookEndpoints

// EndpointInput is a new endpoint.
type EndpointInput struct {
	// URL receives POSTs: http or https, at most 2048 bytes.
	URL string
	// Secret signs the deliveries; "" makes a fresh one (NewSecret).
	Secret string
	// EventTypes are the events it receives, from Types (at least one).
	EventTypes  []string
	Description string
	// Enabled nil means true.
	Enabled *bool
}

// EndpointUpdate changes an endpoint; nil fields stay as they are.
type EndpointUpdate struct {
	URL         *string
	Secret      *string
	EventTypes  []string
	Description *string
	Enabled     *bool
}

// MaxPage bounds one page of deliveries.
const MaxPage = 100

func requireAdmin(p inventory.Principal) error {
	if !p.Admin {
		return inventory.ErrForbidden
	}
	return nil
}

// CreateEndpoint subscribes an endpoint to the events recorded from now on.
func (s *Service) CreateEndpoint(ctx context.Context, p inventory.Principal, in EndpointInput) (db.WebhookEndpoint, error) {
	if err := requireAdmin(p); err != nil {
		return db.WebhookEndpoint{}, err
	}
	if in.Secret == "" {
		in.Secret = NewSecret()
	}
	enabled := in.Enabled == nil || *in.Enabled
	if err := validate(&in.URL, &in.Secret, in.EventTypes, &in.Description); err != nil {
		return db.WebhookEndpoint{}, err
	}
	e, err := s.ledger.Webhooks().CreateWebhookEndpoint(ctx, db.WebhookEndpoint{URL: in.URL, Secret: in.Secret,
		EventTypes: dedupe(in.EventTypes), Description: in.Description, Enabled: enabled})
	if errors.Is(err, db.ErrTooManyEndpoints) {
		return db.WebhookEndpoint{}, &inventory.InvalidInputError{Field: "url", Reason: fmt.Sprintf("at most %d endpoints may exist", db.MaxWebhookEndpoints)}
	}
	return e, ledgerError("creating a webhook endpoint", 0, err)
}

// SecretOverlap is how long the secret a new one replaces keeps signing
// beside it: every delivery meanwhile carries both signatures, so the
// receiver can move to the new secret at any time in that day.
const SecretOverlap = 24 * time.Hour

// UpdateEndpoint changes an endpoint. A new secret signs from the next
// attempt on, the one it replaces beside it for SecretOverlap; new event
// types apply to events recorded from now on.
func (s *Service) UpdateEndpoint(ctx context.Context, p inventory.Principal, id string, u EndpointUpdate) (db.WebhookEndpoint, error) {
	if err := requireAdmin(p); err != nil {
		return db.WebhookEndpoint{}, err
	}
	n, err := endpointID(id)
	if err != nil {
		return db.WebhookEndpoint{}, err
	}
	if u.EventTypes != nil {
		u.EventTypes = dedupe(u.EventTypes)
	}
	if err := validate(u.URL, u.Secret, u.EventTypes, u.Description); err != nil {
		return db.WebhookEndpoint{}, err
	}
	e, err := s.ledger.Webhooks().UpdateWebhookEndpoint(ctx, n, db.WebhookEndpointUpdate{URL: u.URL, Secret: u.Secret,
		KeepPreviousFor: SecretOverlap, EventTypes: u.EventTypes, Description: u.Description, Enabled: u.Enabled})
	return e, ledgerError("updating a webhook endpoint", n, err)
}

// DeleteEndpoint removes an endpoint with its pending and dead deliveries.
func (s *Service) DeleteEndpoint(ctx context.Context, p inventory.Principal, id string) (db.WebhookEndpoint, error) {
	if err := requireAdmin(p); err != nil {
		return db.WebhookEndpoint{}, err
	}
	n, err := endpointID(id)
	if err != nil {
		return db.WebhookEndpoint{}, err
	}
	e, err := s.ledger.Webhooks().DeleteWebhookEndpoint(ctx, n)
	return e, ledgerError("deleting a webhook endpoint", n, err)
}

// Endpoints lists every endpoint.
func (s *Service) Endpoints(ctx context.Context, p inventory.Principal) ([]db.WebhookEndpoint, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	e, err := s.ledger.Webhooks().WebhookEndpoints(ctx, false)
	return e, ledgerError("listing webhook endpoints", 0, err)
}

// Deliveries lists up to limit deliveries of an endpoint with a status
// (db.WebhookPending, db.WebhookDelivered, db.WebhookDead: its dead
// letters), oldest first, after the event id given ("" from the start).
func (s *Service) Deliveries(ctx context.Context, p inventory.Principal, id, status, after string, limit int) ([]db.WebhookDelivery, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	n, err := endpointID(id)
	if err != nil {
		return nil, err
	}
	var afterEvent int64
	if after != "" {
		if afterEvent, err = EventID(after); err != nil {
			return nil, &inventory.InvalidInputError{Field: "after", Reason: "is not a webhook id"}
		}
	}
	if limit < 1 || limit > MaxPage {
		return nil, &inventory.InvalidInputError{Field: "first", Reason: "must be between 1 and " + strconv.Itoa(MaxPage)}
	}
	if _, err := s.ledger.Webhooks().WebhookEndpoint(ctx, n); err != nil {
		return nil, ledgerError("reading a webhook endpoint", n, err)
	}
	d, err := s.ledger.Webhooks().WebhookDeliveries(ctx, n, status, afterEvent, limit)
	return d, ledgerError("listing webhook deliveries", n, err)
}

// Redeliver makes an endpoint's dead letters pending again, due at once:
// those of the given webhook ids, or all of them when ids is nil. It
// returns how many.
func (s *Service) Redeliver(ctx context.Context, p inventory.Principal, id string, ids []string) (int, error) {
	if err := requireAdmin(p); err != nil {
		return 0, err
	}
	n, err := endpointID(id)
	if err != nil {
		return 0, err
	}
	var events []int64
	if ids != nil {
		events = make([]int64, 0, len(ids))
		for _, s := range ids {
			ev, err := EventID(s)
			if err != nil {
				return 0, &inventory.InvalidInputError{Field: "webhookIds", Reason: fmt.Sprintf("%.80q is not a webhook id", s)}
			}
			events = append(events, ev)
		}
	}
	if _, err := s.ledger.Webhooks().WebhookEndpoint(ctx, n); err != nil {
		return 0, ledgerError("reading a webhook endpoint", n, err)
	}
	count, err := s.ledger.Webhooks().RedeliverWebhooks(ctx, n, events)
	return count, ledgerError("redelivering webhooks", n, err)
}

// MessageID is the webhook-id of an event: "msg_" and its outbox id.
func MessageID(event int64) string { return "msg_" + strconv.FormatInt(event, 10) }

// EventID is the outbox id of a webhook-id.
func EventID(messageID string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimPrefix(messageID, "msg_"), 10, 64)
	if err != nil || n <= 0 || !strings.HasPrefix(messageID, "msg_") {
		return 0, fmt.Errorf("%q is not a webhook id", messageID)
	}
	return n, nil
}

func endpointID(id string) (int64, error) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 {
		return 0, &inventory.NotFoundError{Kind: "webhook endpoint", Key: id, Field: "id"}
	}
	return n, nil
}

// ledgerError translates the ledger's errors for the API.
func ledgerError(op string, id int64, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, db.ErrNotFound):
		return &inventory.NotFoundError{Kind: "webhook endpoint", Key: strconv.FormatInt(id, 10), Field: "id"}
	case errors.Is(err, db.ErrInvalid):
		return &inventory.InvalidInputError{Field: "input", Reason: "refused by the ledger's checks"}
	}
	return fmt.Errorf("%s: %w: %w", op, inventory.ErrUnavailable, err)
}

func validate(rawURL, secret *string, types []string, description *string) error {
	if rawURL != nil {
		u, err := url.Parse(*rawURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(*rawURL) > 2048 || u.User != nil {
			return &inventory.InvalidInputError{Field: "url", Reason: "must be an absolute http or https URL without credentials, at most 2048 bytes"}
		}
	}
	if secret != nil && ValidSecret(*secret) != nil {
		return &inventory.InvalidInputError{Field: "secret", Reason: ErrBadSecret.Error()}
	}
	if types != nil {
		if len(types) == 0 {
			return &inventory.InvalidInputError{Field: "eventTypes", Reason: "must name at least one event type"}
		}
		for _, t := range types {
			if !KnownType(t) {
				return &inventory.InvalidInputError{Field: "eventTypes", Reason: fmt.Sprintf("%.64q is not one of %s", t, strings.Join(Types, ", "))}
			}
		}
	}
	if description != nil && len([]rune(*description)) > 200 {
		return &inventory.InvalidInputError{Field: "description", Reason: "must be at most 200 characters"}
	}
	return nil
}

func dedupe(types []string) []string {
	out := make([]string, 0, len(types))
	seen := map[string]bool{}
	for _, t := range types {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
