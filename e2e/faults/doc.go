// Package faults holds Dropline's whole-system fault and abuse tests.
// Each test builds nothing of its own: TestMain builds the real
// `dropline` binary once, and every scenario runs `dropline serve`
// processes against a private redis-server and a fresh Postgres database,
// drives a drop over GraphQL HTTP, injects one fault (FLUSHALL, a Redis
// restart, SCRIPT FLUSH, a cut Postgres link, SIGKILL, lost Redis replies,
// SIGSTOP past a lease, hostile requests) and then checks the guarantees
// of docs/design.md (G1–G9) against Redis and the Postgres ledger.
//
// The checks after every drop (see verify in drop_test.go):
//
//   - no oversell: products.sold <= total, and Redis held + sold <= total,
//     sampled throughout the drop and checked at the end;
//   - every commit a client saw acknowledged is a row of sales, and no
//     cancel a client saw acknowledged is;
//   - no ledger event doubled, no token both sold and released;
//   - once the write-behind has drained, available + held + sold == total
//     in Redis (read over GraphQL), products.sold equals the sales rows and
//     Redis' sold, and Postgres' HELD reservations equal Redis' held;
//   - the service answers again (/readyz and a GraphQL read), and no server
//     log line mentions a panic.
//
// Every scenario is bounded well under a minute; longer variants run with
// -faults.long. Run with: go test -race ./e2e/faults/ (-v shows the
// figures that docs/reliability.md quotes).
package faults
