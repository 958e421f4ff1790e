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
// # Output
//
// WriteText prints the table (throughput and p50/p95/p99/max per
// operation, outcomes by code, the buyers' fates, the verdict), the Result
// marshals to JSON, and WriteHTML writes a report with inline SVG charts of
// the stock, the latency distribution and the outcomes over time, which
// opens offline.
package flashsale
