// Package resolvers is Dropline's GraphQL adapter: thin resolvers that parse
// input, call one inventory.Engine method and map the result, plus the HTTP
// handler that protects them (NewHandler).
//
// Business outcomes are values: every mutation returns a payload whose
// userErrors carry the engine's code (inventory.CodeOf) and a field path
// such as ["input","quantity"]; queries, which have no payload, report them
// as top-level errors with extensions.code. Anything the engine does not
// classify is "internal error" with code INTERNAL and the request id; the
// detail goes to the log only (presenter, recoverer).
//
// Order of protections for one request, outermost first: request id, CORS
// allow-list (403 before anything runs), body size (413), auth.Middleware,
// transport (POST application/json, GET queries only), parser token limit,
// validation, then before any resolver: complexity, depth and the cap on
// root mutation fields, so an aliased mutation bomb is refused whole. Each
// mutation then needs a verified principal and a unit of that principal's
// GCRA budget in Redis.
//
// Redis keys, under the engine's prefix P: P+"apq:<sha256>" for persisted
// queries; "rate:"+P+"mutations:<principal>" for the rate limiter
// (redis_rate adds its own "rate:" in front and expires its keys).
package resolvers
