package auth

import (
	"encoding/json"
	"strings"
	"testing"
)

var duplicateKeyDocs = []string{
	`{"alg":"HS256","typ":"JWT"}`,
	`{"sub":"eve","role":"admin","exp":1900000000,"iat":1800000000}`,
	`{"sub":"eve","role":"buyer","role":"admin","exp":1}`,
	`{"sub":"eve","exp":1,"ctx":[{"a":1,"a":2}]}`,
	`{"sub":"eve","exp":1,"ctx":[{"a":1},{"a":2}],"more":{"sub":"x"}}`,
	`{"a":{"b":{"c":[1,2,{"d":true,"d":null}]}}}`,
	`{"r\u006fle":"admin","role":"buyer"}`,
	`{"r\\ole":1,"r\\ole":2}`,
	`{"\u00e9":1,"é":2}`,
	`{"é":1,"e":2}`,
	"{\"\xff\":1,\"\xfe\":2}",
	`{"":1,"":2}`,
	`{"a":"x\"y","b":"\\","a":3}`,
	` { "a" : [ ] , "b" : { } , "a" : 1 } `,
	`{"a":1,}`,
	`{"a":1 "a":2}`,
	`{"a" 1}`,
	`{"a":1`,
	`{"a":"1`,
	`[{"a":1,"a":2}]`,
	`[1,2,3]`,
	`"just a string"`,
	`12`,
	``,
	`{`,
	`{"a":[1,2,}`,
	`{"a":1}{"a":1,"a":2}`,
	`{"x":-1.5e3,"y":false,"x":0}`,
	strings.Repeat("[", 100) + `{"a":1,"a":2}` + strings.Repeat("]", 100),
	strings.Repeat(`{"a":`, 100) + `{"b":1,"b":2}` + strings.Repeat("}", 100),
}

// duplicateKey finds the duplicate encoding/json's tokenizer finds on
// every document the parser reads (with escapes, and bytes that are not
// UTF-8), and reads the others without failing.
func TestDuplicateKeyAgreesWithTheTokenizer(t *testing.T) {
	valid := 0
	for _, doc := range duplicateKeyDocs {
		wantKey, want := duplicateKeyByTokens([]byte(doc))
		gotKey, got := duplicateKey([]byte(doc))
		if !json.Valid([]byte(doc)) {
			continue
		}
		valid++
		if got != want || gotKey != wantKey {
			t.Errorf("%q: duplicateKey says %q %v, the tokenizer %q %v", doc, gotKey, got, wantKey, want)
		}
	}
	if valid < 15 {
		t.Fatalf("only %d documents were valid JSON", valid)
	}
}

func FuzzDuplicateKey(f *testing.F) {
	for _, doc := range duplicateKeyDocs {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		wantKey, want := duplicateKeyByTokens(doc)
		gotKey, got := duplicateKey(doc)
		// On a document the parser refuses the tokenizer may stop early;
		// only documents encoding/json reads must agree.
		if !json.Valid(doc) {
			return
		}
		if got != want || gotKey != wantKey {
			t.Errorf("%q: duplicateKey says %q %v, the tokenizer %q %v", doc, gotKey, got, wantKey, want)
		}
	})
}

func BenchmarkDuplicateKey(b *testing.B) {
	doc := []byte(`{"sub":"buyer-000123","role":"","exp":1900000000,"iat":1800000000}`)
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			duplicateKey(doc)
		}
	})
	b.Run("tokenizer", func(b *testing.B) {
		for b.Loop() {
			duplicateKeyByTokens(doc)
		}
	})
}
