package lua

import (
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// TestEveryScriptIsListedAndLoads checks that each .lua file but lib.lua is a
// named script and that each name has its file.
func TestEveryScriptIsListedAndLoads(t *testing.T) {
	names, err := fs.Glob(files, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range names {
		name := strings.TrimSuffix(f, ".lua")
		if name != "lib" && !slices.Contains(All, name) {
			t.Errorf("%s is not in All", f)
		}
	}
	for _, name := range All {
		if _, err := Source(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestHeaders checks that every script opens with its contract: its KEYS,
// its ARGV (when it takes any), what it returns, and why it is one script.
func TestHeaders(t *testing.T) {
	for _, name := range All {
		body, err := files.ReadFile(name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		header := leadingComment(string(body))
		if !strings.HasPrefix(header, "-- "+name+".lua: ") {
			t.Errorf("%s: the header must start with %q", name, "-- "+name+".lua: ")
		}
		for _, want := range []string{"-- KEYS[1] ", "Returns", "Why one script"} {
			if !strings.Contains(header, want) {
				t.Errorf("%s: the header does not say %q", name, want)
			}
		}
		if strings.Contains(string(body), "ARGV[") && !strings.Contains(header, "-- ARGV[1] ") {
			t.Errorf("%s: uses ARGV but its header does not list it", name)
		}
	}
}

func leadingComment(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
