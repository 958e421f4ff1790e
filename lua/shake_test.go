package lua

import (
	"strings"
	"testing"
)

// TestShakeKeepsWhatTheBodyReaches checks that a script carries the
// library's definitions its body reaches, directly or through others, in
// the library's order, and none other; a field's name, a table
// constructor's key, a comment or a string reaches nothing.
func TestShakeKeepsWhatTheBodyReaches(t *testing.T) {
	lib := `-- head
local policy = { a = true }
local function unused()
  return 1
end

local function leaf(x)
  return x .. 'leaf' -- unused()
end

local function walk(x)
  return leaf(x)
end
local function caller(x)
  return walk(x) .. [[ unused ]]
end
local k1, k2 = 'a', 'b'
local forward
`
	body := `
local t = { walk = 1, unused = 2 }
local s = t.unused .. ARGV[1]:walk() .. 'unused' .. k2
return caller(policy.a)
`
	got := shake(lib, body)
	for _, want := range []string{"-- head", "local policy", "local function leaf", "local function walk", "local function caller", "local k1, k2", "local forward"} {
		if !strings.Contains(got, want) {
			t.Errorf("shaken library lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "local function unused") {
		t.Errorf("shaken library keeps unused:\n%s", got)
	}
	if strings.Index(got, "local function leaf") > strings.Index(got, "local function caller") {
		t.Errorf("shaken library reorders its definitions:\n%s", got)
	}
}

// TestShakeIsStable checks that every script's text is the same twice over
// (its SHA is what the engine calls it by).
func TestShakeIsStable(t *testing.T) {
	for _, name := range All {
		a, errA := Source(name)
		b, errB := Source(name)
		if errA != nil || errB != nil || a != b {
			t.Errorf("%s: two renderings differ (%v, %v)", name, errA, errB)
		}
	}
}
