package cpugate

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// RedisHook gives the request's slot back while a command or a pipeline
// is on its way to Redis and back (Pause). Install it on a client with
// AddHook, only when a gate is in use (the server does so when
// DROPLINE_GATE_SLOTS is above 0): for a context without a ticket it does
// nothing but look for one.
type RedisHook struct{}

var _ redis.Hook = RedisHook{}

// DialHook leaves dialing as it is.
func (RedisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook pauses the request for one command.
func (RedisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if FromContext(ctx) == nil {
			return next(ctx, cmd)
		}
		defer Pause(ctx)()
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook pauses the request for one pipeline.
func (RedisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if FromContext(ctx) == nil {
			return next(ctx, cmds)
		}
		defer Pause(ctx)()
		return next(ctx, cmds)
	}
}
