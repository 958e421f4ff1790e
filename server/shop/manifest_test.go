package shop

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/formatter"
	"github.com/vektah/gqlparser/v2/parser"

	"github.com/dropline/dropline/server/graphql"
)

// The shop's manifest of trusted documents (web/shop/persisted-query-manifest.json,
// written by web/shop/manifest.mjs) lists exactly the operations of
// web/shop/src/operations.js, each under the SHA-256 of its body, and loads
// as a server with DROPLINE_TRUSTED_DOCUMENTS loads it (every document
// validates against the schema). An operation changed or added without
// running `make shop` fails here, before a server in trusted mode refuses it.
func TestShopManifestListsItsOperations(t *testing.T) {
	src, err := os.ReadFile("../../web/shop/src/operations.js")
	require.NoError(t, err)
	raw, err := os.ReadFile("../../web/shop/persisted-query-manifest.json")
	require.NoError(t, err)

	want := map[string]string{} // operation name: its document, formatted
	for _, m := range regexp.MustCompile("(?s)export const (\\w+) = `([^`]*)`;").FindAllSubmatch(src, -1) {
		name, text := canonical(t, string(m[2]))
		require.NotContains(t, string(m[2]), "${", "%s: write the document out in full", m[1])
		require.NotContains(t, want, name, "two operations named %s", name)
		want[name] = text
	}
	require.NotEmpty(t, want, "no operations found in operations.js")

	var manifest struct {
		Format     string `json:"format"`
		Version    int    `json:"version"`
		Operations []struct {
			ID, Body, Name, Type string
		} `json:"operations"`
	}
	require.NoError(t, json.Unmarshal(raw, &manifest))
	require.Equal(t, "apollo-persisted-query-manifest", manifest.Format)
	require.Equal(t, 1, manifest.Version)
	got := map[string]string{}
	for _, op := range manifest.Operations {
		sum := sha256.Sum256([]byte(op.Body))
		require.Equal(t, hex.EncodeToString(sum[:]), op.ID, "%s: the id is its body's SHA-256", op.Name)
		name, text := canonical(t, op.Body)
		require.Equal(t, op.Name, name)
		got[name] = text
	}
	require.Equal(t, want, got, "persisted-query-manifest.json is stale: run `make shop` (web/shop/manifest.mjs)")

	docs, err := graphql.ParseTrustedDocuments(raw)
	require.NoError(t, err)
	require.Equal(t, len(want), docs.Len())
}

// canonical parses a document of one named operation and returns its name
// and its text as gqlparser formats it, so that spacing does not count.
func canonical(t *testing.T, doc string) (string, string) {
	t.Helper()
	q, err := parser.ParseQuery(&ast.Source{Input: doc})
	require.NoError(t, err, doc)
	require.Len(t, q.Operations, 1, doc)
	require.Empty(t, q.Fragments, doc)
	var b bytes.Buffer
	formatter.NewFormatter(&b).FormatQueryDocument(q)
	return q.Operations[0].Name, b.String()
}
