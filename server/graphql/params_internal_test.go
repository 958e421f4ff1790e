package graphql

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"maps"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// paramsBodies are bodies decodeParams takes and bodies it must leave to
// encoding/json, with the edges where the two could differ.
var paramsBodies = []string{
	`{"query":"mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token expiresAt } } }","variables":{"input":{"sku":"BENCH-HOT","quantity":1}}}`,
	` {"query": "{ a }", "operationName": null, "variables": null, "extensions": null} `,
	`{"query":"query {\n  a\t}\u00e9\"\\\/\b\f\r","operationName":"A"}`,
	`{"variables":{"n":-0.5e+10,"m":12345678901234567890,"z":0,"e":1E3,"f":[],"g":{},"h":[1,"x",true,false,null,[{"a":{}}]]}}`,
	`{"variables":{"a":1,"a":{"b":2}},"extensions":{"persistedQuery":{"version":1,"sha256Hash":"abc"}}}`,
	`{"query":"{ a }"} trailing bytes`,
	`{"query":"{ a }"}{"query":"{ b }"}`,
	`{}`, `null`, ``, ` `, `[]`, `"x"`, `{"query":`, `{"query":"a"`, `{"query":"a",}`,
	`{"Query":"{ a }"}`, `{"query":"{ a }","query":"{ b }"}`, `{"query":"{ a }","other":1}`,
	`{"variables":{"a":1},"variables":{"b":2}}`, `{"query":5}`, `{"query":"\ud83d\ude00"}`,
	`{"query":"\ud800"}`, "{\"query\":\"\xff\"}", "{\"query\":\"a\x01\"}", `{"query":"\x"}`,
	`{"variables":{"n":01}}`, `{"variables":{"n":-}}`, `{"variables":{"n":1.}}`, `{"variables":{"n":1e}}`,
	`{"variables":{"n":tru}}`, `{"variables":[1]}`, `{"operationName":{}}`, `{"query":"\u00"}`,
	`{"variables":` + strings.Repeat(`{"a":`, 80) + `1` + strings.Repeat(`}`, 80) + `}`,
	"{\"query\":\"caf\u00e9 \u2028\"}",
	"{\"query\":\"a\\n\xff\"}", "{\"variables\":{\"s\":\"\xc3\"}}", "{\"variables\":{\"s\":\"\u00e9\\t\xc3\xa9\"}}",
	`{"documentId":"sha256:abc","variables":{"n":1}}`, `{"doc_id":"42","query":null}`,
	`{"documentId":"a","documentId":"b"}`, `{"documentId":7}`, `{"doc_id":null,"documentId":"x"}`,
}

// decodeParams decodes a body exactly as decodeJSON does, or declines it:
// a body it declines is decoded, and refused, by decodeJSON as before.
func TestDecodeParamsDecodesLikeEncodingJSON(t *testing.T) {
	took := 0
	for _, body := range paramsBodies {
		if sameParams(t, []byte(body)) {
			took++
		}
	}
	require.GreaterOrEqual(t, took, 8, "the fast decoder should take the ordinary bodies")
	require.True(t, decodeParams([]byte(paramsBodies[0]), &requestParams{}), "the reserve body")
}

func FuzzDecodeParams(f *testing.F) {
	for _, b := range paramsBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) { sameParams(t, body) })
}

// sameParams fails the test when decodeParams takes body and gets another
// result than decodeJSON; it reports whether decodeParams took it.
func sameParams(t *testing.T, body []byte) bool {
	t.Helper()
	var got requestParams
	if !decodeParams(body, &got) {
		return false
	}
	var want requestParams
	require.NoError(t, decodeJSON(bytes.NewReader(body), &want), "%q", body)
	require.Equal(t, want, got, "%q", body)
	return true
}

// A response of data alone is written around its bytes; every response is
// written as json.Marshal writes it (less the data entry where nothing
// executed).
func TestWriteResponseIsWhatJSONMarshalWrites(t *testing.T) {
	yes := true
	for _, resp := range []*gqlgen.Response{
		{Data: json.RawMessage(`{"reserve":{"reservation":{"token":"a.b","expiresAt":"2026-12-01T19:00:00Z"},"userErrors":[]}}`)},
		{Data: json.RawMessage(`{"a":"x y","b":"\"\\","c":null,"d":[1,2.5e3]}`)},
		{Data: json.RawMessage(`{"a":"<b> & c"}`)},
		{Data: json.RawMessage("{\"a\":\"\u2028\u2029\u00e9\"}")},
		{Data: json.RawMessage(`{ "a" : 1 }`)},
		{Data: json.RawMessage(`null`)},
		{Data: json.RawMessage(`{"a":1}`), Errors: gqlerror.List{{Message: "boom"}}},
		{Data: json.RawMessage(`{"a":1}`), Extensions: map[string]any{"x": 1}},
		{Data: json.RawMessage(`{"a":1}`), HasNext: &yes, Label: "l"},
	} {
		want, err := json.Marshal(resp)
		require.NoError(t, err)
		var got bytes.Buffer
		writeResponse(&got, resp)
		require.Equal(t, string(want), got.String())
	}
	// A cost report given beside the response is written as the same
	// report among its extensions is.
	cost := &costReport{requested: 3, actual: 2, ran: true, budgets: true, maximum: 100, current: 97, rate: 10}
	for _, resp := range []*gqlgen.Response{
		{Data: json.RawMessage(`{"reserve":{"userErrors":[{"code":"OUT_OF_STOCK"}]}}`)},
		{Data: json.RawMessage(`{"a":"<b> & c"}`)},
		{Data: json.RawMessage(`null`), Errors: gqlerror.List{{Message: "boom"}}},
		{Errors: gqlerror.List{{Message: "bad"}}},
		{Data: json.RawMessage(`{"a":1}`), Extensions: map[string]any{"x": 1}},
	} {
		withCost := *resp
		withCost.Extensions = map[string]any{"cost": cost}
		maps.Copy(withCost.Extensions, resp.Extensions)
		var want, got bytes.Buffer
		writeResponse(&want, &withCost)
		require.Contains(t, want.String(), `"extensions":{`)
		before := maps.Clone(resp.Extensions)
		writeResponseCost(&got, resp, cost)
		require.Equal(t, want.String(), got.String())
		require.Equal(t, before, resp.Extensions, "the response's own extensions are left as they are")
	}
	var got bytes.Buffer
	writeResponse(&got, &gqlgen.Response{Errors: gqlerror.List{{Message: "bad"}}})
	require.Equal(t, `{"errors":[{"message":"bad"}]}`, got.String())
}

// The strings requests send again and again (documents, names) are one
// copy, the body's bytes are not what they are made of, and the copies
// kept are bounded.
func TestDecodeParamsKeepsOneCopyOfItsStrings(t *testing.T) {
	body := []byte(paramsBodies[0])
	// The table is a cache: two of the body's strings in one slot evict
	// each other and are copied again, which the seed drawn at start
	// makes happen in about one run in a hundred. This body's document
	// and names are given slots of their own.
	var doc struct{ Query string }
	require.NoError(t, json.Unmarshal(body, &doc))
	seedApart(t, &decodedStrings, "query", doc.Query, "variables", "input", "sku", "quantity")
	var a, b requestParams
	require.True(t, decodeParams(bytes.Clone(body), &a))
	again := bytes.Clone(body)
	require.True(t, decodeParams(again, &b))
	require.Equal(t, a, b)
	require.Same(t, unsafe.StringData(a.Query), unsafe.StringData(b.Query), "the document's one copy")
	nameOf := func(m map[string]any) string {
		for k := range m {
			return k
		}
		return ""
	}
	require.Same(t, unsafe.StringData(nameOf(a.Variables)), unsafe.StringData(nameOf(b.Variables)), "the variable's name's one copy")
	skuOf := func(p requestParams) string { return p.Variables["input"].(map[string]any)["sku"].(string) }
	require.Same(t, unsafe.StringData(skuOf(a)), unsafe.StringData(skuOf(b)), "the variable's value's one copy")
	// Nothing but the two objects' maps: no string, and no interface
	// value of the SKU or the quantity, of its own.
	require.Equal(t, 4.0, testing.AllocsPerRun(100, func() {
		var p requestParams
		decodeParams(again, &p)
	}))
	query := b.Query
	clear(again)
	require.Equal(t, query, b.Query, "not the body's bytes")

	tab := internTable{seed: maphash.MakeSeed()}
	kept := func() (n int, longest int) {
		for i := range tab.slots {
			if v, _ := tab.slots[i].Load().(string); v != "" {
				n, longest = n+1, max(longest, len(v))
			}
		}
		return n, longest
	}
	for i := range 3 * internSlots {
		intern[string](&tab, []byte(strconv.Itoa(i)))
	}
	n, _ := kept()
	require.LessOrEqual(t, n, internSlots)
	intern[string](&tab, bytes.Repeat([]byte("x"), internMaxLen+1))
	_, longest := kept()
	require.LessOrEqual(t, longest, internMaxLen, "a long string is not kept")
	require.Equal(t, strings.Repeat("x", internMaxLen+1), intern[string](&tab, bytes.Repeat([]byte("x"), internMaxLen+1)))
	a1, a2 := intern[string](&tab, []byte("again")).(string), intern[string](&tab, []byte("again")).(string)
	require.Equal(t, "again", a2)
	require.Same(t, unsafe.StringData(a1), unsafe.StringData(a2))
	require.Equal(t, "x", intern[string](&tab, []byte("x")))
}

// BenchmarkDecodeParams: the body of the reserve clients send, decoded on
// every core at once.
func BenchmarkDecodeParams(b *testing.B) {
	body := []byte(paramsBodies[0])
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			var p requestParams
			if !decodeParams(body, &p) {
				b.Error("the reserve body was not taken")
				return
			}
		}
	})
}

// seedApart gives tab a seed under which strs fall in distinct slots. The
// test calling it must not run in parallel: the table is the package's.
func seedApart(t *testing.T, tab *internTable, strs ...string) {
	t.Helper()
	for range 1000 {
		seed := maphash.MakeSeed()
		slots := map[uint64]bool{}
		for _, s := range strs {
			slots[maphash.String(seed, s)%internSlots] = true
		}
		if len(slots) == len(strs) {
			old := tab.seed
			tab.seed = seed
			t.Cleanup(func() { tab.seed = old })
			return
		}
	}
	t.Fatalf("no seed puts %d strings in distinct slots of %d", len(strs), internSlots)
}
