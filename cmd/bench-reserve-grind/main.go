// Command bench-reserve-grind drives a Redis with batches of reserve.lua,
// run as the engine runs it (FCALL of its function, the KEYS and ARGV
// script.Reserve builds), so that redis-server's instructions per hold can
// be counted under callgrind; docs/benchmarks.md quotes what it measured.
// One SKU, no drop, no per-person limit, no idempotency key, every request
// spending its buyer's budget (a burst nothing reaches, whose key lives on,
// so each request reads and writes it), 1,000 buyers in turn. Every request
// must be held: any other reply stops it with exit status 1.
//
// The procedure (a private server, its slow log off so that valgrind's slow
// clock logs nothing):
//
//	valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \
//	  redis-server --port 6390 --save '' --appendonly no --slowlog-log-slower-than -1 &
//	bench-reserve-grind -addr 127.0.0.1:6390 -setup -batches 100 -size 8 -tag w
//	callgrind_control -z <pid>
//	bench-reserve-grind -addr 127.0.0.1:6390 -batches 200 -size 8 -tag m -first 100000
//	callgrind_control -d <pid>
//	callgrind_annotate --inclusive=yes /tmp/cg.<pid>.1 | grep -E 'TOTALS|:serverCron |:fcallCommand '
//
// A hold costs (the whole count less serverCron's) ÷ (batches × size);
// fcallCommand's inclusive count is the script's part of it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6390", "the Redis to drive (loopback)")
	setup := flag.Bool("setup", false, "load the function and write the SKU first")
	batches := flag.Int("batches", 100, "batches to send")
	size := flag.Int("size", 8, "requests per batch")
	tag := flag.String("tag", "w", "the tokens' prefix (each run its own)")
	first := flag.Int("first", 0, "the first request's number (its buyer is this modulo 1,000)")
	flag.Parse()
	if err := run(*addr, *setup, *batches, *size, *tag, *first); err != nil {
		fmt.Fprintln(os.Stderr, "bench-reserve-grind:", err)
		os.Exit(1)
	}
}

func run(addr string, setup bool, batches, size int, tag string, first int) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }()
	code, fn, err := lua.Function(lua.Reserve)
	if err != nil {
		return err
	}
	k := script.NewKeys("grind:")
	const sku = "sku1"
	p := k.PartitionOf(sku)
	if setup {
		if err := rdb.Do(ctx, "FUNCTION", "LOAD", "REPLACE", code).Err(); err != nil {
			return err
		}
		if err := rdb.HSet(ctx, k.SKU(sku), "gen", "1", "avail", "100000000", "held", "0", "seq", "1000", "max", "0",
			"start", "0", "end", "0", "total", "100000000", "sold", "0", "ver", "1").Err(); err != nil {
			return err
		}
	}
	n := first
	for range batches {
		reqs := make([]script.ReserveRequest, size)
		for i := range reqs {
			who := fmt.Sprintf("buyer%d", n%1000)
			reqs[i] = script.ReserveRequest{SKU: sku, Principal: who, Quantity: 1, HoldMs: 600_000,
				Token: fmt.Sprintf("%s.%d", tag, n), BudgetKey: "grind:rate:" + who, Budget: [3]any{"1000000", "1", "60"}}
			n++
		}
		c := script.Reserve{Partition: p, IdempotencyTTL: 86400, MaxQuantity: 10, MaxHoldMs: 900_000, RejectionTTL: 60,
			Requests: reqs}.Call(k)
		args := make([]any, 0, 3+len(c.Keys)+len(c.Argv))
		args = append(args, "FCALL", fn, len(c.Keys))
		for _, key := range c.Keys {
			args = append(args, key)
		}
		args = append(args, c.Argv...)
		res, err := rdb.Do(ctx, args...).Slice()
		if err != nil {
			return err
		}
		replies, err := script.ReserveRepliesOf(res, size)
		if err != nil {
			return err
		}
		for i, r := range replies {
			if r.Code != "HELD" {
				return fmt.Errorf("request %d answered %+v", i, r)
			}
		}
	}
	return nil
}
