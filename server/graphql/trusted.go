package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/dropline/dropline/graph"
	"github.com/dropline/dropline/internal/prom"
)

// CodePersistedQueryNotAllowed refuses a document sent as text, or under an
// id its manifest does not list, by a server that runs trusted documents
// only.
const CodePersistedQueryNotAllowed = "PERSISTED_QUERY_NOT_ALLOWED"

// extDocumentID is the extension under which a request's documentId or
// doc_id travels from the transport that read it to the parameters'
// mutator (a client may also send it there).
const extDocumentID = "documentId"

// apolloManifestFormat is the format field of the manifest Apollo's
// generate-persisted-query-manifest writes.
const apolloManifestFormat = "apollo-persisted-query-manifest"

// TrustedDocuments are the only documents a server in trusted mode runs:
// the operations a shop's build listed in its manifest, each under its id.
// The zero value is unusable; LoadTrustedDocuments makes one.
type TrustedDocuments struct {
	byID map[string]string
}

// LoadTrustedDocuments reads a manifest from path: Apollo's persisted query
// manifest ({"format": "apollo-persisted-query-manifest", "version": 1,
// "operations": [{"id", "body", "name", "type"}]}) or the map of id to
// document that Relay's compiler and graphql-codegen's client preset
// write. Every document must parse and validate against Dropline's schema,
// so a manifest of another API or a stale one fails at start-up rather than
// at the first buyer.
func LoadTrustedDocuments(path string) (*TrustedDocuments, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading trusted documents: %w", err)
	}
	docs, err := ParseTrustedDocuments(b)
	if err != nil {
		return nil, fmt.Errorf("trusted documents in %s: %w", path, err)
	}
	return docs, nil
}

// ParseTrustedDocuments is LoadTrustedDocuments of a manifest's bytes.
func ParseTrustedDocuments(b []byte) (*TrustedDocuments, error) {
	var head struct {
		Format     string          `json:"format"`
		Version    json.Number     `json:"version"`
		Operations json.RawMessage `json:"operations"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&head); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	byID := map[string]string{}
	if head.Format != "" {
		if head.Format != apolloManifestFormat || head.Version != "1" {
			return nil, fmt.Errorf("format %q version %s: want %q version 1, or a map of id to document", head.Format, head.Version, apolloManifestFormat)
		}
		var ops []struct {
			ID   string `json:"id"`
			Body string `json:"body"`
		}
		if err := json.Unmarshal(head.Operations, &ops); err != nil {
			return nil, fmt.Errorf("operations: %w", err)
		}
		for i, op := range ops {
			if op.ID == "" || op.Body == "" {
				return nil, fmt.Errorf("operation %d has no id or no body", i)
			}
			if prev, dup := byID[op.ID]; dup && prev != op.Body {
				return nil, fmt.Errorf("id %s names two documents", op.ID)
			}
			byID[op.ID] = op.Body
		}
	} else if err := json.Unmarshal(b, &byID); err != nil {
		return nil, fmt.Errorf("want Apollo's persisted query manifest or a map of id to document: %w", err)
	}
	if len(byID) == 0 {
		return nil, errors.New("the manifest lists no documents")
	}
	schema := graph.NewExecutableSchema(graph.Config{}).Schema()
	for id, body := range byID {
		if _, errs := gqlparser.LoadQueryWithRules(schema, body, nil); len(errs) > 0 {
			return nil, fmt.Errorf("document %s: %w", id, errs)
		}
	}
	return &TrustedDocuments{byID: byID}, nil
}

// Len is how many documents the manifest lists.
func (d *TrustedDocuments) Len() int { return len(d.byID) }

// lookup returns the document listed under id. graphql-codegen and Hive
// may prefix an id with its algorithm ("sha256:…") where Apollo's link
// sends the bare hash: either spelling finds a document listed under the
// other.
func (d *TrustedDocuments) lookup(id string) (string, bool) {
	if doc, ok := d.byID[id]; ok {
		return doc, true
	}
	if bare, ok := strings.CutPrefix(id, "sha256:"); ok {
		doc, ok := d.byID[bare]
		return doc, ok
	}
	doc, ok := d.byID["sha256:"+id]
	return doc, ok
}

// trustedOnly runs listed documents only, named by their id: Apollo's
// extensions.persistedQuery.sha256Hash, or documentId / doc_id (which the
// transports move to extDocumentID). It replaces the automatic persisted
// queries, so nothing is registered. In dev mode a document sent as text
// still runs, so the playground and curl work while a shop is developed;
// outside dev mode such a document is refused with
// PERSISTED_QUERY_NOT_ALLOWED before it is parsed. An unknown id is
// PERSISTED_QUERY_NOT_FOUND, with the message Apollo's and urql's links
// look for: they resend the text, which is then refused in its turn.
type trustedOnly struct {
	docs    *TrustedDocuments
	dev     bool
	refused *prometheus.CounterVec
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.OperationParameterMutator
} = (*trustedOnly)(nil)

func newTrustedOnly(docs *TrustedDocuments, dev bool, reg prometheus.Registerer) *trustedOnly {
	return &trustedOnly{
		docs: docs, dev: dev,
		refused: prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dropline_graphql_untrusted_documents_total",
			Help: "Requests refused because they named no listed trusted document, by reason (unknown_id, not_listed).",
		}, []string{"reason"})),
	}
}

// ExtensionName names the extension in gqlgen's stats.
func (*trustedOnly) ExtensionName() string { return "TrustedDocuments" }

// Validate accepts any schema: the documents were validated when loaded.
func (*trustedOnly) Validate(gqlgen.ExecutableSchema) error { return nil }

// MutateOperationParameters replaces the request's document with the one
// listed under its id, or refuses it.
func (t *trustedOnly) MutateOperationParameters(ctx context.Context, raw *gqlgen.RawParams) *gqlerror.Error {
	id, err := requestDocumentID(raw)
	if err != nil {
		return err
	}
	if id != "" {
		if doc, ok := t.docs.lookup(id); ok {
			raw.Query = doc
			return nil
		}
		if raw.Query == "" {
			t.refused.WithLabelValues("unknown_id").Inc()
			return persistedQueryNotFound()
		}
	}
	if t.dev && raw.Query != "" {
		return nil
	}
	t.refused.WithLabelValues("not_listed").Inc()
	zerolog.Ctx(ctx).Debug().Str("operation", raw.OperationName).Msg("refused a document that is not trusted")
	e := gqlerror.Errorf("only trusted documents run here: send the id of a document the server's manifest lists (documentId, doc_id or extensions.persistedQuery.sha256Hash), not its text")
	errcode.Set(e, CodePersistedQueryNotAllowed)
	return e
}

// requestDocumentID is the id a request names its document by: Apollo's
// persisted query hash, or a documentId or doc_id. Naming two different
// ones is an error.
func requestDocumentID(raw *gqlgen.RawParams) (string, *gqlerror.Error) {
	var hash string
	if ext, present := raw.Extensions["persistedQuery"]; present && ext != nil {
		pq, _ := ext.(map[string]any)
		hash, _ = pq["sha256Hash"].(string)
		if hash == "" {
			return "", gqlerror.Errorf("invalid APQ extension data")
		}
	}
	id, _ := raw.Extensions[extDocumentID].(string)
	switch {
	case id == "":
		return hash, nil
	case hash != "" && hash != id && "sha256:"+hash != id:
		return "", gqlerror.Errorf("the request names two documents: its documentId and its persisted query hash differ")
	}
	return id, nil
}

func persistedQueryNotFound() *gqlerror.Error {
	err := gqlerror.Errorf("PersistedQueryNotFound")
	errcode.Set(err, CodePersistedQueryNotFound)
	return err
}

// documentIDs are the members by which persisted-document clients name a
// document instead of sending it: documentId (the GraphQL over HTTP
// draft's, graphql-codegen's, Hive's) and doc_id (Relay's examples).
type documentIDs struct {
	DocumentID string `json:"documentId"`
	DocID      string `json:"doc_id"`
}

// requestParams is a request's parameters as the transports decode them:
// gqlgen's and the document ids it does not know.
type requestParams struct {
	gqlgen.RawParams
	documentIDs
}

// params returns the request's parameters with its document id, if any,
// moved into the extensions, where the mutators read it.
func (p *requestParams) params() *gqlgen.RawParams {
	p.moveTo(&p.RawParams)
	return &p.RawParams
}

// moveTo records the id in raw's extensions. documentId wins over doc_id,
// and both over what the extensions held.
func (d documentIDs) moveTo(raw *gqlgen.RawParams) {
	id := d.DocumentID
	if id == "" {
		id = d.DocID
	}
	if id == "" {
		return
	}
	if raw.Extensions == nil {
		raw.Extensions = map[string]any{}
	}
	raw.Extensions[extDocumentID] = id
}

// documentIDExecutor gives the operations gqlgen's own transports decode
// (SSE) the document id of a body they read without it.
type documentIDExecutor struct {
	gqlgen.GraphExecutor
	ids documentIDs
}

func (e documentIDExecutor) CreateOperationContext(ctx context.Context, params *gqlgen.RawParams) (*gqlgen.OperationContext, gqlerror.List) {
	e.ids.moveTo(params)
	return e.GraphExecutor.CreateOperationContext(ctx, params)
}

// withDocumentID wraps exec so that the operation of body gets body's
// document id; exec itself when body names none.
func withDocumentID(exec gqlgen.GraphExecutor, body []byte) gqlgen.GraphExecutor {
	if !bytes.Contains(body, []byte("doc")) {
		return exec
	}
	var ids documentIDs
	if json.Unmarshal(body, &ids) != nil || ids == (documentIDs{}) {
		return exec
	}
	return documentIDExecutor{GraphExecutor: exec, ids: ids}
}

// hasDocument reports whether a request names a document at all: its text,
// a persisted query hash or a document id.
func hasDocument(p *gqlgen.RawParams) bool {
	return p.Query != "" || p.Extensions["persistedQuery"] != nil || p.Extensions[extDocumentID] != nil
}
