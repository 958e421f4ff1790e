// Package httpbench measures the reserve hot path black-box: the real
// dropline binary as a separate process behind a loopback socket, driven by
// another process, next to the two baselines it is compared with, all in one
// run on the same Redis and PostgreSQL.
//
// One Run, in order:
//
//  1. Setup: a private redis-server on a free loopback port (nothing else
//     shares its CPU counters or keys), a fresh PostgreSQL database, the
//     binary migrated and started with `dropline serve` on another free
//     loopback port at its default settings (the mutation rate limit on).
//     Products are created through the GraphQL API with an admin token;
//     buyers are distinct principals with signed JWTs.
//  2. GraphQL reserves at full speed: wrk, one thread driving 50
//     connections, buyers rotated round-robin, one unit per call from a
//     stock that never runs out.
//     Only successful holds count; the stock the server reports afterwards
//     must agree with wrk's count. The CPU time each process used over the
//     step (dropline, redis-server, the database's PostgreSQL backends and
//     wrk itself, read from /proc) is divided by the holds: the machine's
//     whole cost of one hold, which holds still when other work shares it.
//     With Config.Floor, the floor server (bench/floor: net/http and gqlgen
//     serving the same schema, reserve returning a fixed reservation) is
//     then started and driven by the same wrk script, tokens and
//     connections; Dropline's CPU per hold is divided by its CPU per
//     request.
//  3. The sold-out storm, right after the reserve step (the closer
//     the two steps, the more alike the machine's speed in both): 10,000 buyers asking for a SKU with no stock,
//     rate limit at its defaults; answered/s and percentiles, and the CPU
//     time per answer of dropline, redis-server and wrk. With
//     Config.Floor, the bare net/http handler (bench/floor.BareHandler:
//     the sold-out answer's bytes and headers, nothing parsed) is then
//     driven by the storm's wrk script, tokens and connections; Dropline's
//     CPU per answer is divided by its CPU per request, and the CPU per hold
//     by its, wrk's and redis-server's per answer: the storm's ratio to the
//     holds were an answer to cost no more over net/http.
//  4. Raw Redis: a reserve-shaped script (DECRBY, HSET, ZADD, XADD) by
//     EVALSHA with redis-benchmark -c 50 against the same redis-server,
//     whose CPU per call is what its CPU per hold in step 2 is divided by.
//  5. PostgreSQL only: pgbench, 50 clients, one transaction per reserve
//     (a conditional UPDATE of the hot row that inserts the hold only when
//     it took a unit), latency percentiles from pgbench's per-transaction log.
//  6. Constant rate at 80 % of the maximum of step 2 (an open-loop driver in
//     this process: latency counts from when a request was due, so a stall
//     is not hidden by the driver waiting for it).
//  7. A sustained peak (wrk at full speed for Config.Peak) while /metrics is
//     sampled: the write-behind lag, the events applied, and the flusher's
//     busy time, from which its apply capacity follows, and the backends'
//     CPU time per applied event.
//
// Every step is bounded in time and talks to loopback addresses only. The
// processes it starts are stopped by their own handles, and the database it
// created is dropped, when Run returns.
package httpbench
