// Package resolvers is Dropline's GraphQL adapter: thin resolvers that parse
// input, call one inventory.Engine method and map the result, their
// dataloaders, and the mapping of outcomes to payloads, userErrors and
// error codes. The HTTP handler that serves them, with its transports and
// limits, is server/graphql.
//
// Business outcomes are values: every mutation returns a payload whose
// userErrors carry the engine's code and public message (inventory.ErrorCode
// and inventory.ErrorMessage, one vocabulary) and a field path such as
// ["input","quantity"]; queries, which have no payload, report them
// as top-level errors with extensions.code. Anything the engine does not
// classify is "internal error" with code INTERNAL and the request id; the
// detail goes to the log only (Resolver.ErrorPresenter, Resolver.Recover).
//
// Each mutation needs a verified principal and a unit of that principal's
// GCRA budget in Redis. Every list of the schema is priced at the most
// items it can return (complexity.go: connections by their `first`, up to
// MaxPageSize; a drop's products by theirs, up to 100), and every read a
// field makes once per item of a list goes through a per-request
// dataloader (loaders.go), so a request costs one read per kind, not one
// per item.
//
// # Subscriptions
//
// stockChanged and reservationChanged take their values from a live.Hub; a
// resolver only converts them, in one goroutine per subscription that
// selects on ctx.Done, so the hub never waits for a client.
// reservationChanged re-reads the reservation whenever its SKU's stock
// moves (every hold change does) and every ReservationRecheck, sends only
// changes and completes after a final status. The transport describes the
// connection as a Stream in the context: a subscription beyond its cap gets
// TOO_MANY_SUBSCRIPTIONS, and when the hub drops a subscriber or stops, a
// websocket subscription ends with an UNAVAILABLE error message (SSE just
// completes).
//
// Redis keys, under the engine's prefix P: "rate:"+P+"budget:<principal>"
// for the rate limiter (its arrival time in whole microseconds, see lib.lua's
// rate_check; it expires once the budget is full again). Earlier releases
// kept float seconds under "rate:"+P+"mutations:<principal>", which this
// one never reads, so a release of each kind running side by side during an
// upgrade reads only what it wrote. A reserve spends its budget in
// the engine, in the same script run as the reserve when Redis is a single
// node; every other mutation spends it first, in a script of its own.
package resolvers
