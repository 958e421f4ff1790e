package app

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/internal/cpugate"
)

// heldProbe records, for each PING and pipeline that reaches it, whether
// the request's ticket held its slot of the gate then (the commands that
// open a connection are left out). Added after the client's own hooks, it
// runs inside them, as the command does.
type heldProbe struct{ held []bool }

func (p *heldProbe) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *heldProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if t := cpugate.FromContext(ctx); t != nil && cmd.Name() == "ping" {
			p.held = append(p.held, t.Held())
		}
		return next(ctx, cmd)
	}
}

func (p *heldProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if t := cpugate.FromContext(ctx); t != nil && len(cmds) > 0 && cmds[0].Name() == "ping" {
			p.held = append(p.held, t.Held())
		}
		return next(ctx, cmds)
	}
}

// The client connectRedis builds gives a request's slot of the gate back
// while a command or a pipeline waits for Redis when the gate is on, and has
// no such hook when it is off (DROPLINE_GATE_SLOTS 0, the default): there no
// request carries a ticket, and the hook would cost a context lookup per
// command. A ticket is put in the context by hand in both cases: with the
// hook the slot is given back for the command and taken again after it;
// without it, the slot stays held.
func TestGateHookOnlyWithTheGateOn(t *testing.T) {
	ctx := context.Background()
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = config.DefaultRedisURL
	}
	for _, slots := range []int{0, 4} {
		cfg := config.Default()
		cfg.RedisURL = url
		cfg.GateSlots = slots
		rdb, err := connectRedis(ctx, cfg, zerolog.Nop(), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = rdb.Close() })
		probe := &heldProbe{}
		rdb.AddHook(probe)

		ticket := cpugate.New(1).NewTicket()
		_, err = ticket.Acquire(ctx, time.Second)
		require.NoError(t, err)
		tctx := cpugate.WithTicket(ctx, ticket)
		require.NoError(t, rdb.Ping(tctx).Err())
		_, err = rdb.Pipelined(tctx, func(p redis.Pipeliner) error {
			p.Ping(tctx)
			p.Ping(tctx)
			return nil
		})
		require.NoError(t, err)
		require.True(t, ticket.Held(), "slots %d: the request holds its slot again after Redis answered", slots)
		ticket.Leave()

		require.Len(t, probe.held, 2, "slots %d: a command and a pipeline", slots)
		if slots > 0 {
			require.Equal(t, []bool{false, false}, probe.held, "the gate is on: the slot is given back while Redis works")
		} else {
			require.Equal(t, []bool{true, true}, probe.held, "the gate is off: the client has no gate hook")
		}
	}
}
