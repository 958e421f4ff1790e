package script

import "context"

// Call is one run of a script: its name (a constant of package lua), its
// KEYS and its ARGV, in the order the script's header gives.
type Call struct {
	Script string
	Keys   []string
	Argv   []any
}

// Runner runs a call and returns its reply. The engine's runner sends it by
// SHA (EVAL on NOSCRIPT), traces it, and reports a Redis error as
// unavailable; a script's reply is never an error.
type Runner func(ctx context.Context, c Call) (Reply, error)

// run is the shape of every typed function below: build the call, run it,
// decode its reply.
func run[T any](ctx context.Context, r Runner, c Call, decode func(Reply) T) (T, error) {
	rep, err := r(ctx, c)
	if err != nil {
		var zero T
		return zero, err
	}
	return decode(rep), nil
}
