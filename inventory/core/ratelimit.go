package core

import "time"

// RateLimit is one principal's mutation budget: GCRA, Rate mutations per
// Period on average and bursts of up to Burst, kept in Redis under Key so
// that every instance shares it. It is the algorithm of the go-redis
// redis_rate limiter counted in whole microseconds (lib.lua's rate_check),
// and every script that spends a budget reads and writes it the same way.
type RateLimit struct {
	Key    string
	Rate   int
	Period time.Duration
	Burst  int
}

// Args is the budget as the scripts take it: burst, rate, period in seconds.
// A period of whole seconds is sent as an integer, the same text its float
// would be: the client's formatting of a float cost a reserve more than all
// its other arguments together.
func (l *RateLimit) Args() [3]any {
	if l == nil {
		return [3]any{"", "", ""}
	}
	var period any = l.Period.Seconds()
	if l.Period%time.Second == 0 {
		period = int64(l.Period / time.Second)
	}
	return [3]any{l.Burst, l.Rate, period}
}
