package lua

import (
	"crypto/sha1" //nolint:gosec // as function.go
	"encoding/hex"
	"strings"
	"testing"
)

// A function's library is named after its script's whole text, and runs
// the script's body, after the library's definitions, in its one function.
func TestFunctionIsNamedAfterItsText(t *testing.T) {
	for _, name := range Functions {
		code, fn, err := Function(name)
		if err != nil {
			t.Fatal(err)
		}
		src := MustSource(name)
		sum := sha1.Sum([]byte(src)) //nolint:gosec // as function.go
		if want := "dropline_" + name + "_" + hex.EncodeToString(sum[:8]); fn != want {
			t.Errorf("%s: function %q, want %q", name, fn, want)
		}
		if !strings.HasPrefix(code, "#!lua name="+fn+"\n") {
			t.Errorf("%s: the library is not named %s", name, fn)
		}
		body, _ := files.ReadFile(name + ".lua")
		defs := strings.TrimSuffix(src, string(body))
		want := "#!lua name=" + fn + "\n" + defs + "redis.register_function('" + fn + "', function(KEYS, ARGV)\n" + string(body) + "\nend)\n"
		if code != want {
			t.Errorf("%s: the library is not the definitions, then the body in its function", name)
		}
	}
}
