// Package graphql builds Dropline's /graphql handler: gqlgen's server over
// the resolvers, with its transports (GraphQL over HTTP, websockets, SSE),
// caches, persisted queries, limits, CORS, the body limit and the caps on
// live connections. The resolvers themselves only resolve (package
// resolvers); this package decides how requests reach them.
//
// Order of protections for one request, outermost first (inside the
// server's request id, access log and recoverer, which give every request
// the id and the logger, zerolog.Ctx, that errors here quote): CORS
// allow-list (403 before anything runs), auth.Middleware (401
// UNAUTHENTICATED for an Authorization header that does not verify,
// whatever the request asks), body size (413), stream caps (websocket/SSE only), transport (websocket, SSE, then
// httpTransport: POST application/json, GET for queries only, 405 for a
// mutation; a request that never executes answers without a data entry,
// 200 for application/json and 400 for application/graphql-response+json,
// as the GraphQL over HTTP specification asks), parser token limit,
// validation, then before any resolver: depth, the cap on root mutation
// fields (so an aliased mutation bomb is refused whole), the price against
// the cost limit, and when the operation is dispatched, its caller's
// cost budget (429 over HTTP). While it runs, the response's size is
// bounded. Every priced response carries extensions.cost (cost.go).
//
// # Websockets and SSE
//
// Subscriptions stream over websockets (graphql-transport-ws and the
// legacy graphql-ws, served by wsTransport, which answers message for
// message and byte for byte as gqlgen's websocket transport does:
// TestWebsocketAnswersLikeGqlgen) and GraphQL over SSE (sseTransport:
// gqlgen's transport, except that a shared subscription's stream over
// HTTP/1 is taken from net/http after its headers and first comment and
// served like a websocket, on the shared writers and ticker, with the
// bytes gqlgen sends: TestSSEAnswersLikeGqlgen; its connection closes
// after it). The handler of such a stream returns once it is taken, so
// net/http lets go of the connection's goroutine, buffers and request,
// and the stream costs one small goroutine, a reader waiting for the
// client to go; it keeps its slots under the connection caps until then,
// and its token's expiry (seen by the ticker) and the server's shutdown
// (http.Server.Shutdown) end it with complete. A
// websocket costs one goroutine, its reader, and a 512-byte read buffer;
// writes are made by a few shared writers with writes that never wait (a
// socket that does not take one at once gets a goroutine of its own to
// finish it under WriteTimeout), and every connection's keep-alives, pong
// deadline, init timeout and token expiry are checked by one shared
// ticker, so ten thousand idle subscribers hold ten thousand goroutines and
// no timers. Websocket life: the upgrade passes CORS (403), its own
// Authorization header if it has one (401) and the per-address cap
// (429); connection_init must come within InitTimeout (else 1002) and its
// token ("Authorization" or "authToken", else the upgrade's header) must
// verify (else 4403); a principal over its cap gets 4429; the token's
// expiry closes the connection with 4403 (the graphql-ws client then
// reconnects with fresh connectionParams). Messages above MessageBytes
// close it with 1009, an unanswered ping after two PingIntervals ends it,
// and a write that cannot complete within WriteTimeout (a client that
// stopped reading) drops it. Operations in flight beyond SubscriptionsPerConn
// (subscriptions, and queries and mutations until they are answered) get
// TOO_MANY_SUBSCRIPTIONS before they run. Caps are per process. The
// protocol's frames are package internal/websocket's.
//
// # Shared subscriptions
//
// A drop's browsers all send the same stockChanged document with the same
// variables. Such subscriptions (same document, operation name and
// coerced variables; stockChanged is public, so what a caller may see does
// not depend on the caller) form a group: gqlgen's executor runs the
// document once per update for the whole group, on one hub subscription,
// and every member, on either websocket protocol or SSE, is handed the
// same response, so the bytes are gqlgen's own (TestSharedSubscriptionsAnswerLikeGqlgen
// compares them). A member holds no goroutine, channel or buffer beyond
// what its transport has: the group keeps the newest response per SKU,
// encoded once per update for every websocket member, and a broadcast
// channel closed on every update. SSE members on gqlgen's transport
// (HTTP/2) wait on the channel; a websocket member or a taken-over SSE
// stream is told of the change, and its connection's writer
// takes the newest value when the socket is ready, so a slow reader costs
// one bounded slot per SKU and is disconnected by the write timeout as
// before. The
// per-connection cap still counts every member. Every other operation
// (reservationChanged, which depends on the caller, and queries or
// mutations over a websocket) is executed on its own. Metrics:
// dropline_graphql_shared_subscriptions (groups),
// dropline_graphql_shared_subscription_members and
// dropline_graphql_shared_executions_total.
//
// Redis keys, under the engine's prefix P: P+"apq:<sha256>" for persisted
// queries, registered only once they ran (persistedQueries), and
// P+"apqbudget:<client address>" for what each address has registered.
package graphql
