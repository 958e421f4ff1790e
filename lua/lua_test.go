package lua

import (
	"io/fs"
	"regexp"
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

// TestKeysComeFromTheCaller checks that no script builds a key name itself:
// every key its caller can name comes in KEYS, and a key derived from data a
// script has just read goes through lib.lua's hold_key, idem_key, sku_keys
// or drop_key, in a script whose header names that exception.
func TestKeysComeFromTheCaller(t *testing.T) {
	keyNames := regexp.MustCompile(`'(sku|hold|quota|idem|avail|rebuild|lease|members|cart|cartidem|drop):|'(expiry|committing|outbox|epoch|cartpending)'|\.\. *'[a-z]+:`)
	derives := regexp.MustCompile(`\b(hold_key|idem_key|sku_keys|cart_key|drop_key)\(`)
	for _, name := range All {
		body, err := files.ReadFile(name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		code := withoutComments(string(body))
		if m := keyNames.FindString(code); m != "" {
			t.Errorf("%s builds a key name itself (%s): pass it in KEYS", name, m)
		}
		if derives.MatchString(code) {
			header := leadingComment(string(body))
			if !strings.Contains(header, "partition base, for the") {
				t.Errorf("%s derives keys from the partition base, but its header does not say which and why", name)
			}
		}
	}
}

func withoutComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
