package floor

import (
	"io"
	"net/http"

	"github.com/dropline/dropline/internal/requestid"
)

// BareBodyBytes bounds the body BareHandler reads: Dropline's default
// limit on a GraphQL request's body.
const BareBodyBytes = 1 << 20

// soldOutAnswer is what Dropline answers the sold-out storm's request (the
// storefront's reserve, bench/httpbench's, of a SKU its sold-out memory
// vouches for) from a buyer whose cost budget is full: its data, and the
// cost report every response carries.
const soldOutAnswer = `{"data":{"reserve":{"reservation":null,"userErrors":[{"code":"OUT_OF_STOCK","retryAfterSeconds":null}]}},` +
	`"extensions":{"cost":{"requestedQueryCost":7,"actualQueryCost":5,"throttleStatus":{"maximumAvailable":10000,"currentlyAvailable":9995,"restoreRate":1000}}}}`

// The RateLimit fields of that answer, at Dropline's default cost budget
// (10,000 points restored at 1,000 a second).
var (
	soldOutPolicy    = []string{`"cost";q=10000;w=10`}
	soldOutRateLimit = []string{`"cost";r=9995;t=1`}
	jsonContentType  = []string{"application/json"}
)

// BareHandler serves POST /graphql with net/http alone: it reads the whole
// body (up to BareBodyBytes; a larger one gets 413) and writes, whatever
// was asked, the bytes and headers of Dropline's answer to the sold-out
// storm's request: 200, Content-Type, a fresh X-Request-Id, RateLimit-Policy
// and RateLimit, the OUT_OF_STOCK user error and its cost report (net/http
// adds Date and Content-Length, as to Dropline's). No GraphQL, no
// authentication, no limits: the least a sold-out answer over net/http can
// cost, which no transport built on it can avoid.
func BareHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /graphql", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, BareBodyBytes)); err != nil {
			http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		h := w.Header()
		h["Content-Type"] = jsonContentType
		h["X-Request-Id"] = []string{requestid.New()}
		h["Ratelimit-Policy"] = soldOutPolicy
		h["Ratelimit"] = soldOutRateLimit
		_, _ = io.WriteString(w, soldOutAnswer)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}
