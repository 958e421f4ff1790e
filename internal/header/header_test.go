package header_test

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/header"
)

// Get answers as http.Header.Get for a key in canonical form.
func TestGetIsHeaderGet(t *testing.T) {
	h := http.Header{}
	h.Add("content-type", "application/json")
	h.Add("X-Request-Id", "a")
	h.Add("X-Request-Id", "b")
	h["Empty"] = []string{}
	for _, k := range []string{"Content-Type", "X-Request-Id", "Empty", "Absent"} {
		require.Equal(t, h.Get(k), header.Get(h, k), k)
	}
}

// Every key the server's packages give Get is in canonical form: another
// would never be found.
func TestKeysAreCanonical(t *testing.T) {
	call := regexp.MustCompile(`header\.Get\([^,]+, ("[^"]*"|[A-Za-z.]+)\)`)
	consts := map[string]string{"server.RequestIDHeader": "X-Request-Id", "RequestIDHeader": "X-Request-Id"}
	found := 0
	for _, dir := range []string{"../../server", "../../server/graphql", "../../auth"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range call.FindAllSubmatch(src, -1) {
				key := string(m[1])
				if k, ok := consts[key]; ok {
					key = k
				} else {
					require.Equal(t, byte('"'), key[0], "%s: a key Get is given that this test does not know: %s", f, key)
					key = key[1 : len(key)-1]
				}
				require.Equal(t, http.CanonicalHeaderKey(key), key, "%s: %s", f, m[0])
				found++
			}
		}
	}
	require.NotZero(t, found)
}
