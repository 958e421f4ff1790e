package httpbench

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisStats is one reading of redis-server's INFO commandstats and of its
// network and command counters.
type redisStats struct {
	cmds map[string]cmdStat
	// in and out are bytes read from and written to clients; commands the
	// commands processed (scripts' inner calls included); reads the read
	// events it handled (total_reads_processed: a syscall each).
	in, out, commands, reads float64
}

// cmdStat is one command's calls and the microseconds Redis spent in it.
type cmdStat struct{ calls, usec float64 }

// readRedisStats reads the counters of the redis-server at addr.
func readRedisStats(ctx context.Context, addr string) (redisStats, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats", "stats").Result()
	if err != nil {
		return redisStats{}, err
	}
	s := redisStats{cmds: map[string]cmdStat{}}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if cmd, ok := strings.CutPrefix(name, "cmdstat_"); ok {
			var st cmdStat
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					st.calls = f
				case "usec":
					st.usec = f
				}
			}
			s.cmds[cmd] = st
			continue
		}
		f, _ := strconv.ParseFloat(rest, 64)
		switch name {
		case "total_net_input_bytes":
			s.in = f
		case "total_net_output_bytes":
			s.out = f
		case "total_commands_processed":
			s.commands = f
		case "total_reads_processed":
			s.reads = f
		}
	}
	return s, nil
}

// perOp renders what Redis did between a and b divided by n operations:
// each command's calls and microseconds per operation, busiest first, then
// the network.
func perOp(a, b redisStats, n int64) string {
	if n <= 0 {
		return ""
	}
	type row struct {
		name        string
		calls, usec float64
	}
	var rows []row
	for name, st := range b.cmds {
		d := row{name: name, calls: st.calls - a.cmds[name].calls, usec: st.usec - a.cmds[name].usec}
		if d.calls > 0 {
			rows = append(rows, d)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].usec > rows[j].usec })
	f := float64(n)
	var sb strings.Builder
	var total float64
	for _, r := range rows {
		total += r.usec
		fmt.Fprintf(&sb, "    %-18s %8.3f calls %7.2f µs  (%.1f µs/call)\n", r.name, r.calls/f, r.usec/f, div(r.usec, r.calls))
	}
	fmt.Fprintf(&sb, "    commands %.2f (µs in scripts' commands counted twice: in the script and in themselves), "+
		"read events %.3f, bytes in %.0f, out %.0f, per operation\n",
		(b.commands-a.commands)/f, (b.reads-a.reads)/f, (b.in-a.in)/f, (b.out-a.out)/f)
	return sb.String()
}
