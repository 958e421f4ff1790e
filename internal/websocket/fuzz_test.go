package websocket

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzReader reads arbitrary bytes as a client's frames, with a limit the
// fuzzer chooses too (up to 128 KiB). Whatever the bytes, the reader
// neither panics nor allocates past the limit (the frame that declares
// 2^63-1 bytes would), returns no message over the limit, pairs its
// hooks, answers as it does when the bytes come one at a time, and ends
// with a close code a server may send, or without one. The seed corpus
// (testdata/fuzz/FuzzReader) is edgeCases at corpusLimit, written by
// TestSeedCorpus.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, limit uint32, in []byte) {
		l := int64(limit % (128 << 10))
		got, rec, err := readAll(bytes.NewReader(in), l)
		if err != nil {
			t.Fatal(err)
		}
		if rec.err != nil {
			t.Fatal(rec.err)
		}
		end := got[len(got)-1]
		if code, ok := strings.CutPrefix(end, "close "); ok {
			n, err := strconv.Atoi(code)
			if err != nil || !ValidCloseCode(n) && n != CloseNoStatus {
				t.Fatalf("the server would close with %q", end)
			}
		} else if end != dropped {
			t.Fatalf("ended with %q", end)
		}
		again, _, err := readAll(oneByteReader{bytes.NewReader(in)}, l)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(again) {
			t.Fatalf("read whole: %q, read a byte at a time: %q", got, again)
		}
	})
}

var updateCorpus = flag.Bool("update-corpus", false, "write FuzzReader's seed corpus from edgeCases")

// TestSeedCorpus: every edge case is in FuzzReader's committed seed
// corpus, as it is today (go test -run TestSeedCorpus -update-corpus
// writes it).
func TestSeedCorpus(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "fuzz", "FuzzReader")
	unsafe := regexp.MustCompile(`[^a-z0-9]+`)
	for _, c := range edgeCases(corpusLimit) {
		name := filepath.Join(dir, "edge-"+strings.Trim(unsafe.ReplaceAllString(strings.ToLower(c.name), "-"), "-"))
		want := fmt.Sprintf("go test fuzz v1\nuint32(%d)\n[]byte(%q)\n", corpusLimit, c.in)
		if *updateCorpus {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(name, []byte(want), 0o644))
			continue
		}
		got, err := os.ReadFile(name)
		require.NoError(t, err, "%s: run go test -run TestSeedCorpus -update-corpus", c.name)
		require.Equal(t, want, string(got), c.name)
	}
}
