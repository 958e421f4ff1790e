// Package flashsale rehearses a flash sale against running Dropline
// servers and judges the outcome; cmd/flashsale is its command line.
//
// # The drop
//
// A Driver mints bearer tokens for B distinct buyers with the servers'
// HS256 secret, creates a SKU with S units and a per-user limit through the
// admin mutation (or takes an existing one), and lets the buyers in,
// Concurrency at a time, over GraphQL HTTP exactly as a frontend would:
// each reserves with its own idempotency key, resending the same request
// when the outcome is unknown (timeout, connection error, UNAVAILABLE,
// RATE_LIMITED), then after a short think commits, cancels or walks away
// according to the ratios. Several target URLs share the buyers
// round-robin, which exercises several server processes on one Redis and
// one Postgres. Every request is timed and its outcome code kept; a
// sampler reads the live stock every 100 ms.
//
// # The verdict
//
// After the last buyer, the driver waits for the write-behind to drain:
// until two readings of the Postgres ledger in a row are identical and
// agree with the live stock, which did not move meanwhile. Judge, a pure
// function, then checks what a buyer and an auditor would: never more held
// and sold than exists (live, at every sample, and in the ledger), every
// commit a buyer saw succeed is a sale row in Postgres with its quantity,
// no sale exists that no buyer was told about (unless that buyer's answer
// was lost, which the driver knows), products.sold equals the sales rows,
// and the live counters equal the ledger's. Any failed check makes the
// command exit non-zero.
//
// Judge depends on nothing but its input, so the tests feed it
// deliberately inconsistent ledgers; the end-to-end test runs a small drop
// against two real servers started in-process on port 0.
//
// # Live watchers
//
// With Watchers > 0 the drop is watched: before the buyers come, that many
// stockChanged subscribers connect (graphql-transport-ws, or SSE), each on
// its own TCP connection from a loopback source address of its own range
// (127.0.0.2 up, PerSourceAddr per address), so a per-address cap of the
// server does not decide the figure. Once all have their first value the
// driver reads the servers' resident memory and goroutines from /metrics
// (before and after: the cost per idle watcher), then makes Changes
// reserves of one unit at ChangeRate per second, each by a principal of its
// own, and nothing else. After the n-th change of a SKU its availability is
// at most initial-n, so a delivery is timed from sending the change to the
// watcher's first value at or below that: coalesced values count, as a
// browser shows them. The holds are cancelled, the drop runs with the
// watchers still connected, and after the drain every watcher must hold the
// final stock of its SKU within ConvergeTimeout (G8: never stale at rest).
// The many-SKUs mode (WatchSKUs > 1) creates more SKUs and spreads the
// watchers and the changes over them. JudgeWatch adds the checks to the
// verdict: all subscribed, all converged, no delivery missing, and the
// delivery p99 and memory per watcher within WatchP99 and WatchRSSKiB.
//
// The watchers' client is our own minimal websocket and SSE reader (one
// goroutine and a 1 KiB buffer each), so ten thousand of them leave the
// CPU to the server being measured; it still shares the machine, and the
// load average during the changes is part of the result. `make watchers`
// (scripts/flashsale.sh) starts a fresh server, on a redis-server and a
// database of its own, and runs it in one command.
//
// # Waitlist
//
// With Waiters > 0, RunWaitlist follows the drop on a SKU of its own: Stock
// holders reserve it out, Waiters buyers join its waitlist together (the
// position each join answers is its place, since nobody leaves), then every
// holder cancels while outsiders reserve. JudgeWaitlist adds the checks:
// one place each, no outsider served while waiters can take the units, the
// first Stock places offered a HELD reservation each and the rest moved up,
// the live stock, and the ledger's waitlist_entries entry by entry.
//
// # Draw
//
// With Mode ModeDraw, RunDraw follows the drop on a SKU of Stock units
// sold by draw, closing DrawWindow after its creation: Entrants buyers
// enter at once (every tenth twice, which must answer the first entry),
// the server draws at closesAt, and every buyer reads its entry until all
// are WON or LOST with the winners' reservations in place. JudgeDraw adds
// the checks: one entry per buyer, every buyer WON or LOST, the stock
// filled as far as the entries fit, each winner holding a HELD reservation
// of its quantity, the revealed seed hashing to the published seedHash,
// and, with the ledger, the draw recomputed by the verification
// `dropline verify-draw` runs (internal/drawverify).
//
// # Output
//
// WriteText prints the table (throughput and p50/p95/p99/max per
// operation, outcomes by code, the buyers' fates, the verdict), the Result
// marshals to JSON, and WriteHTML writes a report with inline SVG charts of
// the stock, the latency distribution and the outcomes over time, which
// opens offline.
package flashsale
