package otlpreceiver_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/dropline/dropline/internal/otlpreceiver"
)

func TestHandlerDecodesWhatACollectorWould(t *testing.T) {
	var got []string
	srv := httptest.NewServer(otlpreceiver.Handler(func(export *coltracepb.ExportTraceServiceRequest) {
		for _, rs := range export.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					got = append(got, sp.GetName())
				}
			}
		}
	}))
	t.Cleanup(srv.Close)

	export := func(name string) []byte {
		b, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{Name: name}}}},
		}}})
		require.NoError(t, err)
		return b
	}
	post := func(path, contentType, encoding string, body []byte) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	require.Equal(t, http.StatusOK, post("/v1/traces", "application/x-protobuf", "", export("plain")))
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, err := zw.Write(export("zipped"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.Equal(t, http.StatusOK, post("/v1/traces", "application/x-protobuf", "gzip", zipped.Bytes()))

	require.Equal(t, http.StatusNotFound, post("/v1/metrics", "application/x-protobuf", "", export("elsewhere")))
	require.Equal(t, http.StatusUnsupportedMediaType, post("/v1/traces", "application/json", "", export("json")))
	require.Equal(t, http.StatusBadRequest, post("/v1/traces", "application/x-protobuf", "gzip", export("not gzip")))
	require.Equal(t, http.StatusBadRequest, post("/v1/traces", "application/x-protobuf", "", []byte{0xff, 0xff, 0xff}))

	require.Equal(t, []string{"plain", "zipped"}, got, "only the two well-formed exports reach the callback")
}
