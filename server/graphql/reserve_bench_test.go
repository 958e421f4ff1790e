package graphql_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/live"
	"github.com/dropline/dropline/server"
	"github.com/dropline/dropline/server/graphql"
)

// BenchmarkReserveOverHTTP: a successful reserve through the whole HTTP
// surface (the server's middleware, the /graphql handler, gqlgen, the
// engine, real Redis) on keep-alive connections, with the access log going
// to a file as it does in production. The client writes prepared requests
// and reads the answers by their Content-Length, so nearly all of the
// allocations and CPU per op are the server's.
func BenchmarkReserveOverHTTP(b *testing.B) {
	e := setup(b)
	const sku = "BENCH-HOT"
	e.CreateProduct(b, map[string]any{"sku": sku, "stock": 1_000_000_000})
	benchReserveOverHTTP(b, e, sku, `"token":"`)
}

// BenchmarkSoldOutOverHTTP: the storm's refusal, a reserve of a SKU the
// sold-out memory vouches for, through the same HTTP surface as
// BenchmarkReserveOverHTTP.
func BenchmarkSoldOutOverHTTP(b *testing.B) {
	e, sku := soldOutSetup(b)
	benchReserveOverHTTP(b, e, sku, `"OUT_OF_STOCK"`)
}

// BenchmarkSoldOutHandler: the storm's refusal through the /graphql
// handler behind the request id's middleware, on a recorder, in the
// benchmark's goroutine: no connection and nothing that waits, so that
// the instructions counted in serveRecorded (valgrind --tool=callgrind
// --toggle-collect='*serveRecorded') are the handler's alone.
func BenchmarkSoldOutHandler(b *testing.B) {
	e, sku := soldOutSetup(b)
	h := server.RequestID(zerolog.New(io.Discard), graphql.NewHandler(graphql.Config{
		Engine: e.Engine, Redis: e.Redis, Verifier: e.Issuer,
		Limits: graphql.Limits{MutationBurst: 1_000_000},
	}))
	body, err := json.Marshal(map[string]any{
		"query":     `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`,
		"variables": map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}},
	})
	require.NoError(b, err)
	const buyers = 64
	reqs := make([]*http.Request, buyers)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodPost, "/graphql", nil)
		reqs[i].Header.Set("Content-Type", "application/json")
		reqs[i].Header.Set("Authorization", e.Token(b, "buyer-"+strconv.Itoa(i), false))
		reqs[i].ContentLength = int64(len(body))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r, w := reqs[i%buyers], httptest.NewRecorder()
		r.Body = io.NopCloser(bytes.NewReader(body))
		serveRecorded(h, w, r)
		if !bytes.Contains(w.Body.Bytes(), []byte(`"OUT_OF_STOCK"`)) {
			b.Fatalf("not a sold-out answer: %s", w.Body)
		}
	}
}

// serveRecorded is h.ServeHTTP(w, r), out of line for callgrind to name.
//
//go:noinline
func serveRecorded(h http.Handler, w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }

// soldOutSetup is an env whose sold-out memory vouches for the SKU it
// returns.
func soldOutSetup(b *testing.B) (*env, string) {
	e := setup(b, func(c *graphql.Config) {
		hub := live.NewHub(live.HubConfig{}, c.Engine, c.Redis, zerolog.Nop(), prometheus.NewRegistry())
		require.NoError(b, hub.Start(context.Background()))
		b.Cleanup(func() { require.NoError(b, hub.Stop(context.Background())) })
		c.Engine.RememberSoldOut(hub)
		c.Live = hub
	})
	const sku = "BENCH-GONE"
	e.CreateProduct(b, map[string]any{"sku": sku, "stock": 0})
	body, err := json.Marshal(map[string]any{"query": `mutation { reserve(input: {sku: "` + sku + `", quantity: 1}) { userErrors { code } } }`})
	require.NoError(b, err)
	for i := 0; !e.Engine.KnownSoldOut(sku); i++ {
		require.Less(b, i, 500, "the memory never vouched for the sold-out SKU")
		r := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", e.Token(b, "buyer-"+strconv.Itoa(i), false))
		e.Handler.ServeHTTP(httptest.NewRecorder(), r)
		time.Sleep(20 * time.Millisecond)
	}
	return e, sku
}

func benchReserveOverHTTP(b *testing.B, e *env, sku, want string) {
	logFile, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	require.NoError(b, err)
	s := server.New(server.Config{
		Addr:   "127.0.0.1:0",
		Logger: zerolog.New(logFile).With().Timestamp().Logger(),
		GraphQL: graphql.NewHandler(graphql.Config{
			Engine: e.Engine, Redis: e.Redis, Verifier: e.Issuer,
			Limits: graphql.Limits{MutationBurst: 1_000_000},
		}),
	})
	require.NoError(b, s.Start(context.Background()))
	b.Cleanup(func() {
		require.NoError(b, s.Stop(context.Background()))
		require.NoError(b, logFile.Close())
	})

	const buyers = 64
	reqs := make([][]byte, buyers)
	body, err := json.Marshal(map[string]any{
		"query":     `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } userErrors { code retryAfterSeconds } } }`,
		"variables": map[string]any{"input": map[string]any{"sku": sku, "quantity": 1}},
	})
	require.NoError(b, err)
	for i := range reqs {
		reqs[i] = fmt.Appendf(nil, "POST /graphql HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			s.Addr(), e.Token(b, "buyer-"+strconv.Itoa(i), false), len(body), body)
	}
	var next atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	defer func() {
		b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	}()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		var resp []byte
		for pb.Next() {
			if _, err := c.Write(reqs[next.Add(1)%buyers]); err != nil {
				b.Error(err)
				return
			}
			if resp, err = readResponse(r, resp); err != nil {
				b.Error(err)
				return
			}
			if !bytes.Contains(resp, []byte(want)) {
				b.Errorf("not the answer wanted (%s): %s", want, resp)
				return
			}
		}
	})
}

// readResponse reads one HTTP/1.1 response with a Content-Length into buf
// and returns its body.
func readResponse(r *bufio.Reader, buf []byte) ([]byte, error) {
	n := -1
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			if n, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return nil, err
			}
		}
	}
	if n < 0 {
		return nil, fmt.Errorf("a response without a Content-Length")
	}
	buf = append(buf[:0], make([]byte, n)...)
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// processCPU is the CPU time this process has used, the client's share of
// a benchmark above included: compared between builds, it tells the
// server's part apart from the wall clock of a shared machine.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
