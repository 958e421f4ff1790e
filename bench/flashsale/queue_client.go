package flashsale

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// QueueTicket is the schema's QueueTicket as the rehearsal reads it.
type QueueTicket struct {
	Number           *int64     `json:"number"`
	Status           string     `json:"status"`
	Pass             *string    `json:"pass"`
	PassExpiresAt    *time.Time `json:"passExpiresAt"`
	PollAfterSeconds int        `json:"pollAfterSeconds"`
}

// QueueInfo is a product's queue and live stock.
type QueueInfo struct {
	Stock Stock `json:"stock"`
	Queue *struct {
		Status          string  `json:"status"`
		AdmittedThrough int     `json:"admittedThrough"`
		Waiting         int     `json:"waiting"`
		SeedHash        string  `json:"seedHash"`
		Seed            *string `json:"seed"`
	} `json:"queue"`
}

// QueueChallenge is the schema's QueueChallenge.
type QueueChallenge struct {
	Challenge string    `json:"challenge"`
	Bits      int       `json:"bits"`
	ExpiresAt time.Time `json:"expiresAt"`
}

const (
	ticketFields      = `number status pass passExpiresAt pollAfterSeconds`
	queueChallengeDoc = `query C($sku: ID) { queueChallenge(sku: $sku) { challenge bits expiresAt } }`
	joinQueueDoc      = `mutation J($input: JoinQueueInput!) { joinQueue(input: $input) { ticket { ` + ticketFields + ` }
  userErrors { code field message retryAfterSeconds } } }`
	myQueueTicketDoc = `query T($sku: ID) { myQueueTicket(sku: $sku) { ` + ticketFields + ` } }`
	queueInfoDoc     = `query Q($sku: ID!) { product(sku: $sku) { stock { available held sold total } queue { status admittedThrough waiting seedHash seed } } }`
	queueChangedDoc  = `subscription W($sku: ID) { queueChanged(sku: $sku) { status admittedThrough waiting } }`
	reservationDoc   = `query R($t: ID!) { reservation(token: $t) { token status quantity expiresAt } }`
)

// QueueChallenge asks for a proof-of-work challenge of sku's queue.
func (c *Client) QueueChallenge(ctx context.Context, bearer, sku string) (QueueChallenge, error) {
	var out struct {
		QueueChallenge QueueChallenge `json:"queueChallenge"`
	}
	err := c.do(ctx, bearer, queueChallengeDoc, map[string]any{"sku": sku}, &out)
	return out.QueueChallenge, err
}

// JoinInput is what a join brings.
type JoinInput struct {
	SKU, Challenge, Proof, AccessCode string
}

// JoinQueue takes (or returns) the bearer's ticket of sku's queue.
func (c *Client) JoinQueue(ctx context.Context, bearer string, in JoinInput) (QueueTicket, *UserError, error) {
	input := map[string]any{"sku": in.SKU}
	for k, v := range map[string]string{"challenge": in.Challenge, "proof": in.Proof, "accessCode": in.AccessCode} {
		if v != "" {
			input[k] = v
		}
	}
	var out struct {
		JoinQueue struct {
			Ticket     *QueueTicket `json:"ticket"`
			UserErrors []UserError  `json:"userErrors"`
		} `json:"joinQueue"`
	}
	if err := c.do(ctx, bearer, joinQueueDoc, map[string]any{"input": input}, &out); err != nil {
		return QueueTicket{}, nil, err
	}
	if ue := out.JoinQueue.UserErrors; len(ue) > 0 {
		return QueueTicket{}, &ue[0], nil
	}
	if out.JoinQueue.Ticket == nil {
		return QueueTicket{}, nil, &CallError{Code: CodeBadReply, Err: errors.New("joinQueue: neither ticket nor userErrors")}
	}
	return *out.JoinQueue.Ticket, nil, nil
}

// MyQueueTicket reads the bearer's ticket of sku's queue; nil when none.
func (c *Client) MyQueueTicket(ctx context.Context, bearer, sku string) (*QueueTicket, error) {
	var out struct {
		MyQueueTicket *QueueTicket `json:"myQueueTicket"`
	}
	err := c.do(ctx, bearer, myQueueTicketDoc, map[string]any{"sku": sku}, &out)
	return out.MyQueueTicket, err
}

// Queue reads sku's queue and live stock.
func (c *Client) Queue(ctx context.Context, sku string) (QueueInfo, error) {
	var out struct {
		Product *QueueInfo `json:"product"`
	}
	if err := c.do(ctx, "", queueInfoDoc, map[string]any{"sku": sku}, &out); err != nil {
		return QueueInfo{}, err
	}
	if out.Product == nil || out.Product.Queue == nil {
		return QueueInfo{}, fmt.Errorf("%s: no such product behind a queue", sku)
	}
	return *out.Product, nil
}

// Reservation reads a hold by its token as its holder.
func (c *Client) Reservation(ctx context.Context, bearer, token string) (*Reservation, error) {
	var out struct {
		Reservation *Reservation `json:"reservation"`
	}
	err := c.do(ctx, bearer, reservationDoc, map[string]any{"t": token}, &out)
	return out.Reservation, err
}
