// Package bench holds Dropline's comparative benchmarks and the
// alternatives they are compared with. Nothing in the product imports it.
//
// `make bench` runs them with the rest (go test -run '^$' -bench . ./...).
// Each top-level benchmark measures its contenders one after the other in
// the same process, on the same machine, against the same Redis and
// PostgreSQL, and prints a small table with the ratios, so a figure is
// always read next to its baseline rather than against last month's run:
//
//   - BenchmarkReserveOverhead: reserve through GraphQL over HTTP, through
//     the engine in-process, and the bare reserve.lua by EVALSHA. What our
//     server costs on top of Redis.
//   - BenchmarkVsPostgres: Dropline against PostgresReserver, the
//     reservation path a team would build first (a conditional UPDATE of
//     one stock row plus an INSERT, in one transaction), on one hot SKU at
//     the same concurrency. Throughput and p99.
//   - BenchmarkWriteBehind: how many ledger events per second
//     db.Ledger.ApplyEvents absorbs in the flusher's batches, against the
//     peak rate at which the reserve path produces them.
//   - BenchmarkHotVsMany: one hot SKU (one Redis key, serial) against the
//     same load spread over 64 SKUs.
//
// Every contender reserves one unit per operation from a stock large
// enough never to run out, as distinct principals, with Concurrency
// goroutines. The client and the servers share the machine, so absolute
// figures are lower bounds; the ratios are the point. docs/benchmarks.md
// records a run.
package bench
