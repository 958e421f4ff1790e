package core

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A budget's period of whole seconds goes to the scripts as an integer whose
// text is what the client writes for the float (strconv's shortest 'f'
// form); any other period goes as the float.
func TestRateLimitPeriodIsSentAsItsSeconds(t *testing.T) {
	text := func(v any) string {
		switch v := v.(type) {
		case int64:
			return strconv.FormatInt(v, 10)
		case float64:
			return strconv.FormatFloat(v, 'f', -1, 64)
		}
		t.Fatalf("period sent as %T", v)
		return ""
	}
	for _, d := range []time.Duration{time.Second, time.Minute, time.Hour, 1500 * time.Millisecond, 250 * time.Millisecond} {
		a := (&RateLimit{Key: "k", Rate: 10, Period: d, Burst: 5}).Args()
		require.Equal(t, strconv.FormatFloat(d.Seconds(), 'f', -1, 64), text(a[2]), "period %s", d)
		require.Equal(t, []any{5, 10}, a[:2])
	}
	require.Equal(t, [3]any{"", "", ""}, (*RateLimit)(nil).Args())
}
