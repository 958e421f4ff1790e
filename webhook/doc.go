// Package webhook is what leaves Dropline besides GraphQL: signed webhooks
// for what the ledger records (Types: a sale, a sell-out, a return to
// stock, a restock, a draw).
//
// Where events come from: triggers of the ledger (db/migrations/
// 0014_webhooks.sql) write each event into the outbox table webhook_events,
// with one webhook_deliveries row per endpoint subscribed to its type, in
// the transaction of the ledger row that records it. An event therefore
// exists exactly when its record does, and costs nothing when no endpoint
// wants it. Each event takes its product's row lock before its id is
// drawn, so the ids of one product's events follow the order their
// transactions committed in.
//
// A delivery's life (one event, one endpoint):
//
//	PENDING --2xx--> DELIVERED
//	   |  \--failure, attempts left--> PENDING (next attempt after a doubling backoff)
//	   \----failure, last attempt----> DEAD --redeliver--> PENDING (attempts from 0)
//
// The worker group's WebhookDispatcher (package worker) claims the oldest
// PENDING delivery of each product and endpoint (SKIP LOCKED, for longer
// than one attempt) in every process, sends it with a Sender and records
// the outcome; Service is what admins do with endpoints and dead letters.
//
// Signing is the Standard Webhooks scheme (Signer): webhook-id (MessageID:
// "msg_" and the outbox id, the same on every attempt), webhook-timestamp
// (Unix seconds), webhook-signature ("v1," and the base64 HMAC-SHA256 of
// id, timestamp and body joined by dots, keyed with the "whsec_" secret).
//
// Failure modes: delivery is at least once. A process that dies mid-attempt
// leaves its claim to lapse and the event is sent again; an outcome that
// cannot be recorded (Postgres down) is treated the same way. An endpoint
// that fails an event holds up that product's later events to it until the
// event is delivered or dead; a dead letter redelivered later arrives after
// them. An endpoint that hangs uses up its own Concurrency slots, each for
// at most Timeout, and nothing else.
package webhook
