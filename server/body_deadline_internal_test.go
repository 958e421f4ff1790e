package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Behind the access log, bounding a body's time allocates nothing of its
// own: the access log's writer holds the body.
func TestBodyDeadlineBehindTheAccessLogAllocatesNothing(t *testing.T) {
	m := newHTTPMetrics(prometheus.NewRegistry())
	handler := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	var deadline time.Time
	allocs := func(h http.Handler) float64 {
		r := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader("{}"))
		body := r.Body
		w := deadlineRecorder{httptest.NewRecorder(), &deadline}
		return testing.AllocsPerRun(100, func() {
			r.Body = body
			h.ServeHTTP(w, r)
		})
	}
	require.Equal(t, allocs(accessLog(m, handler)), allocs(accessLog(m, bodyDeadline(time.Second, handler))))
}

// The body's deadline counts from when the access log began the request.
func TestBodyDeadlineCountsFromTheAccessLogsStart(t *testing.T) {
	var deadline time.Time
	h := bodyDeadline(time.Second, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	sw := &statusWriter{ResponseWriter: deadlineRecorder{httptest.NewRecorder(), &deadline}, start: time.Unix(1000, 0)}
	h.ServeHTTP(sw, httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader("{}")))
	require.Equal(t, time.Time{}, deadline, "lifted once the body was read")
	var set []time.Time
	sw = &statusWriter{ResponseWriter: deadlineRecorder{httptest.NewRecorder(), &deadline}, start: time.Unix(1000, 0)}
	bodyDeadline(time.Second, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { set = append(set, deadline) })).
		ServeHTTP(sw, httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader("{}")))
	require.Equal(t, []time.Time{time.Unix(1001, 0)}, set)
}

// deadlineRecorder records the read deadline set on it.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	deadline *time.Time
}

func (r deadlineRecorder) SetReadDeadline(t time.Time) error {
	*r.deadline = t
	return nil
}
