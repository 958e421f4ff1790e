package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/clientaddr"
)

// requestScope gives the handler what RequestID around the client address
// resolver's middleware gives it, with one copy of the request fewer.
func TestRequestScopeIsRequestIDAroundClientAddr(t *testing.T) {
	p, err := clientaddr.ParsePrefixes([]string{"127.0.0.1"})
	require.NoError(t, err)
	ca := clientaddr.NewResolver(p, clientaddr.XForwardedFor)
	var logs bytes.Buffer
	base := zerolog.New(&logs)
	type seen struct{ id, client, header string }
	serve := func(h func(http.Handler) http.Handler) (s seen) {
		r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		r.RemoteAddr = "127.0.0.1:4000"
		r.Header.Set("X-Forwarded-For", "198.51.100.1, 2001:db8::5")
		r.Header.Set(RequestIDHeader, "lb-1")
		w := httptest.NewRecorder()
		h(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			zerolog.Ctx(r.Context()).Info().Msg("inside")
			s.id, s.client = RequestIDFrom(r.Context()), clientaddr.Of(r)
		})).ServeHTTP(w, r)
		s.header = w.Header().Get(RequestIDHeader)
		return s
	}
	apart := func(next http.Handler) http.Handler { return RequestID(base, ca.Middleware(next)) }
	together := func(next http.Handler) http.Handler { return requestScope(base, ca, next) }

	want := serve(apart)
	require.Equal(t, seen{id: "lb-1", client: "2001:db8::5", header: "lb-1"}, want)
	logged := logs.String()
	logs.Reset()
	require.Equal(t, want, serve(together))
	require.Equal(t, logged, logs.String(), "the handler's logger carries the request id")
	require.Contains(t, logged, `"request_id":"lb-1"`)

	allocs := func(h func(http.Handler) http.Handler) float64 {
		handler := h(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		r.Header.Set(RequestIDHeader, "lb-1")
		w := httptest.NewRecorder()
		return testing.AllocsPerRun(100, func() { handler.ServeHTTP(w, r) })
	}
	require.Less(t, allocs(together), allocs(apart))
}
