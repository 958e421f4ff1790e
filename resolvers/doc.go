// Package resolvers is Dropline's GraphQL adapter: thin resolvers that parse
// input, call one inventory.Engine method and map the result, plus the HTTP
// handler that protects them (NewHandler).
//
// Business outcomes are values: every mutation returns a payload whose
// userErrors carry the engine's code and public message (inventory.ErrorCode
// and inventory.ErrorMessage, one vocabulary) and a field path such as
// ["input","quantity"]; queries, which have no payload, report them
// as top-level errors with extensions.code. Anything the engine does not
// classify is "internal error" with code INTERNAL and the request id; the
// detail goes to the log only (presenter, recoverer).
//
// Order of protections for one request, outermost first: request id, CORS
// allow-list (403 before anything runs), body size (413), auth.Middleware,
// stream caps (websocket/SSE only), transport (websocket, SSE, then
// httpTransport: POST application/json, GET for queries only, 405 for a
// mutation; a request that never executes answers without a data entry,
// 200 for application/json and 400 for application/graphql-response+json,
// as the GraphQL over HTTP specification asks), parser token limit,
// validation, then before any resolver: complexity, depth and the cap on
// root mutation fields, so an aliased mutation bomb is refused whole. Each
// mutation then needs a verified principal and a unit of that principal's
// GCRA budget in Redis.
//
// # Subscriptions
//
// stockChanged and reservationChanged stream over websockets (gqlgen's
// transport, graphql-transport-ws and the legacy graphql-ws) and GraphQL
// over SSE. Values come from a live.Hub; a resolver only converts them, in
// one goroutine per subscription that selects on ctx.Done, so the hub never
// waits for a client. reservationChanged re-reads the reservation whenever
// its SKU's stock moves (every hold change does) and every
// ReservationRecheck, sends only changes and completes after a final
// status.
//
// Websocket life: the upgrade passes CORS (403) and the per-address cap
// (429); connection_init must come within InitTimeout (else 1002) and its
// token ("Authorization" or "authToken", else the upgrade's header) must
// verify (else 4403); a principal over its cap gets 4429; the token's
// expiry closes the connection with 4403 (the graphql-ws client then
// reconnects with fresh connectionParams). Messages above MessageBytes
// close it with 1009, an unanswered ping after two PingIntervals ends it,
// and a write that cannot complete within WriteTimeout (a client that
// stopped reading) drops it. Subscriptions beyond SubscriptionsPerConn get
// TOO_MANY_SUBSCRIPTIONS. When the hub drops a subscriber or stops, a
// websocket subscription ends with an UNAVAILABLE error message (SSE just
// completes). Caps are per process.
//
// Redis keys, under the engine's prefix P: P+"apq:<sha256>" for persisted
// queries; "rate:"+P+"mutations:<principal>" for the rate limiter
// (redis_rate adds its own "rate:" in front and expires its keys).
package resolvers
