package graphql

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/internal/header"
	"github.com/dropline/dropline/resolvers"
)

// The media types of the GraphQL over HTTP specification.
const (
	mediaJSON            = "application/json"
	mediaGraphQLResponse = "application/graphql-response+json"
)

// contentType is the Content-Type header of each response media type, one
// value every response shares instead of one of its own (net/http copies
// the header's values when it writes them).
var contentType = map[string][]string{
	mediaJSON:            {mediaJSON},
	mediaGraphQLResponse: {mediaGraphQLResponse},
}

// httpTransport serves queries and mutations over plain HTTP (GET and
// POST) as the GraphQL over HTTP specification asks, down to its SHOULDs,
// where gqlgen's own GET and POST transports differ:
//
//   - A request that never executes (a parse, validation or variable
//     coercion failure, a refused persisted query or complexity) carries no
//     "data" entry, with either media type.
//   - Accepting application/json, such a failure answers 200, as every
//     response to a well-formed request does; only a request that is not
//     well-formed (a body that is not a JSON object with a string query,
//     undecodable GET parameters, no query at all) gets 400.
//   - Accepting application/graphql-response+json, it answers 400.
//   - A mutation over GET answers 405 with Allow: POST and never runs.
//
// POST accepts only an application/json body, so a cross-site HTML form
// (which cannot send that without a preflight) never reaches a mutation.
type httpTransport struct {
	method string
	// answers answers plain reserves without executing them
	// (reserve_answer.go); nil executes every operation.
	answers *reserveAnswers
}

var _ gqlgen.Transport = httpTransport{}

// Supports claims plain GET and POST requests (not websocket upgrades; SSE
// is claimed first by its own transport).
func (t httpTransport) Supports(r *http.Request) bool {
	if header.Get(r.Header, "Upgrade") != "" || r.Method != t.method {
		return false
	}
	if t.method == http.MethodGet {
		return true
	}
	ct := header.Get(r.Header, "Content-Type")
	if ct == mediaJSON {
		return true // what clients send, and what ParseMediaType would say
	}
	mediaType, _, err := mime.ParseMediaType(ct)
	return err == nil && mediaType == mediaJSON
}

// Do decodes the request, runs it and writes the one response.
func (t httpTransport) Do(w http.ResponseWriter, r *http.Request, exec gqlgen.GraphExecutor) {
	mediaType := responseMediaType(header.Get(r.Header, "Accept"))
	w.Header()["Content-Type"] = contentType[mediaType]
	params, err := t.params(r)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeResponse(w, &gqlgen.Response{Errors: gqlerror.List{badRequest(err.Error())}})
		return
	}
	// params.ReadTime is left zero: only Apollo's tracing extensions,
	// which Dropline does not use, read it, and it took two clock reads.
	params.Headers = r.Header
	if !hasDocument(params) {
		w.WriteHeader(http.StatusBadRequest)
		writeResponse(w, &gqlgen.Response{Errors: gqlerror.List{badRequest("the request has no query")}})
		return
	}

	ctx := r.Context()
	createCtx := ctx
	if t.answers != nil {
		createCtx = markReserveVars(ctx, params)
	}
	opCtx, errs := exec.CreateOperationContext(createCtx, params)
	if errs != nil {
		// Nothing executed: no data entry at all, not even null.
		resp := exec.DispatchError(gqlgen.WithOperationContext(ctx, opCtx), errs)
		if m := meterOf(opCtx); m != nil {
			m.writeHeaders(w.Header())
		}
		if mediaType == mediaGraphQLResponse {
			w.WriteHeader(http.StatusBadRequest)
		}
		writeResponse(w, resp)
		return
	}
	if t.method == http.MethodGet && opCtx.Operation.Operation != ast.Query {
		w.Header().Set("Allow", http.MethodPost)
		w.WriteHeader(http.StatusMethodNotAllowed)
		writeResponse(w, &gqlgen.Response{Errors: gqlerror.List{badRequest("GET serves queries only: send " + string(opCtx.Operation.Operation) + "s with POST")}})
		return
	}
	a, answered := t.answers.answer(ctx, opCtx)
	resp := a.resp
	if !answered {
		responses, ctx := exec.DispatchOperation(ctx, opCtx)
		resp = responses(ctx)
	}
	if resp == nil {
		// The executor answers nothing once the request's context has
		// ended: the client is gone (it gave up, or this process was
		// paused past its timeout), and there is no one to write to.
		return
	}
	// The caller's budget refused it: nothing executed, and the client is
	// told when to come back.
	if m := meterOf(opCtx); m != nil && m.writeHeaders(w.Header()) && m.throttled() {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	writeResponseCost(w, resp, a.cost)
	a.release()
}

// params reads the request's query, operationName, variables, extensions
// and document id from the URL (GET) or the JSON body (POST).
func (t httpTransport) params(r *http.Request) (*gqlgen.RawParams, error) {
	p := &requestParams{}
	if t.method == http.MethodPost {
		body, err := bodyBytes(r)
		if err != nil {
			return nil, fmt.Errorf("could not read the request body: %w", err)
		}
		if decodeParams(body, p) {
			return p.params(), nil
		}
		p = &requestParams{}
		if err := decodeJSON(bytes.NewReader(body), p); err != nil {
			return nil, fmt.Errorf("the body is not a GraphQL request (a JSON object with a string query): %w", err)
		}
		return p.params(), nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("the URL's parameters cannot be decoded: %w", err)
	}
	p.Query, p.OperationName = q.Get("query"), q.Get("operationName")
	p.DocumentID, p.DocID = q.Get("documentId"), q.Get("doc_id")
	for name, dst := range map[string]any{"variables": &p.Variables, "extensions": &p.Extensions} {
		if v := q.Get(name); v != "" {
			if err := decodeJSON(strings.NewReader(v), dst); err != nil {
				return nil, fmt.Errorf("the %s parameter is not a JSON object: %w", name, err)
			}
		}
	}
	return p.params(), nil
}

// decodeJSON keeps numbers as json.Number, as gqlgen's transports do, so
// large integers reach the resolvers intact.
func decodeJSON(r io.Reader, v any) error {
	d := json.NewDecoder(r)
	d.UseNumber()
	return d.Decode(v)
}

// responseMediaType picks the response's media type from Accept: the first
// of application/graphql-response+json and application/json it lists;
// application/json when Accept is absent or a wildcard, as the
// specification asks for clients that predate the newer type.
func responseMediaType(accept string) string {
	if strings.TrimSpace(accept) == "" {
		return mediaJSON
	}
	for part := range strings.SplitSeq(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "*/*", "application/*", mediaJSON:
			return mediaJSON
		case mediaGraphQLResponse:
			return mediaGraphQLResponse
		}
	}
	return mediaGraphQLResponse
}

// writeResponse writes one GraphQL response; a response that never executed
// has no data entry (gqlgen.Response always writes one, null when empty).
// A response of data alone (and its cost) whose bytes encoding/json would
// leave as they are (plainJSON) is written around them without marshaling
// them again.
func writeResponse(w io.Writer, resp *gqlgen.Response) {
	writeResponseCost(w, resp, nil)
}

// writeResponseCost is writeResponse for a response whose cost extension
// is cost when cost is not nil, written as if resp.Extensions held it
// under "cost" (and nothing else under that name), without the map.
func writeResponseCost(w io.Writer, resp *gqlgen.Response, cost *costReport) {
	given := cost != nil
	costOnly := given && len(resp.Extensions) == 0
	if !given {
		cost, costOnly = resp.Extensions["cost"].(*costReport)
		costOnly = costOnly && len(resp.Extensions) == 1
	}
	if len(resp.Errors) == 0 && resp.Label == "" && len(resp.Path) == 0 && resp.HasNext == nil &&
		(len(resp.Extensions) == 0 || costOnly) && plainJSON(resp.Data) {
		b := responseBuffers.get()
		b.WriteString(`{"data":`)
		b.Write(resp.Data)
		if costOnly {
			b.WriteString(`,"extensions":{"cost":`)
			b.Write(cost.appendJSON(b.AvailableBuffer()))
			b.WriteByte('}')
		}
		b.WriteByte('}')
		// w keeps nothing of what it is given (io.Writer), so the buffer
		// serves the next response.
		_, _ = w.Write(b.Bytes())
		responseBuffers.put(b)
		return
	}
	if given {
		r := *resp
		r.Extensions = make(map[string]any, len(resp.Extensions)+1)
		maps.Copy(r.Extensions, resp.Extensions)
		r.Extensions["cost"] = cost
		resp = &r
	}
	var b []byte
	var err error
	if resp.Data == nil {
		b, err = json.Marshal(struct {
			Errors     gqlerror.List  `json:"errors,omitempty"`
			Extensions map[string]any `json:"extensions,omitempty"`
		}{resp.Errors, resp.Extensions})
	} else {
		b, err = json.Marshal(resp)
	}
	if err != nil {
		b, _ = json.Marshal(map[string]any{"errors": []map[string]any{{"message": "internal error", "extensions": map[string]any{"code": resolvers.CodeInternal}}}})
	}
	_, _ = w.Write(b)
}

// bufferPool lends out buffers for the bytes of a response while they are
// written, so that each response does not allocate its own.
type bufferPool struct{ p sync.Pool }

// maxPooledBuffer bounds the buffers a bufferPool keeps: a large response
// now and then does not pin its memory for every later small one.
const maxPooledBuffer = 16 << 10

// responseBuffers are the HTTP transport's: the answer's data
// (reserveAnswers) and the response around it.
var responseBuffers bufferPool

func (p *bufferPool) get() *bytes.Buffer {
	if b, _ := p.p.Get().(*bytes.Buffer); b != nil {
		return b
	}
	return bytes.NewBuffer(make([]byte, 0, 512))
}

func (p *bufferPool) put(b *bytes.Buffer) {
	if b.Cap() > maxPooledBuffer {
		return
	}
	b.Reset()
	p.p.Put(b)
}

// plainJSON reports whether data, which gqlgen writes as valid JSON, is
// what json.Marshal makes of it as a json.RawMessage: no space outside its
// strings to compact away and nothing it escapes for HTML (<, >, &, U+2028,
// U+2029; any 0xE2 byte is taken as one of the last two).
func plainJSON(data []byte) bool {
	if len(data) == 0 {
		return false
	}
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '<', '>', '&', 0xE2:
			return false
		case ' ', '\t', '\n', '\r':
			if !inString {
				return false
			}
		case '"':
			inString = !inString
		case '\\':
			i++ // the escaped byte; an escape is ASCII
		}
	}
	return true
}

func badRequest(msg string) *gqlerror.Error {
	return &gqlerror.Error{Message: msg, Extensions: map[string]any{"code": "BAD_REQUEST"}}
}
