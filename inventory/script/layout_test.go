package script

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// builtNames is every key name Keys (and the rebuild's Staged) can build,
// one per exported builder (found by reflection, so a new builder is seen),
// with each argument written <> and the partition tag {p}.
func builtNames(t *testing.T) map[string]string {
	t.Helper()
	k := NewKeys("dl:")
	tag := regexp.MustCompile(`\{p\d\d\}`)
	out := map[string]string{}
	builders := func(v reflect.Value, prefix string) {
		for i := range v.NumMethod() {
			m, mt := v.Method(i), v.Type().Method(i)
			ft := m.Type()
			if ft.NumOut() != 1 || ft.Out(0).Kind() != reflect.String || mt.Name == "Base" {
				continue
			}
			args := make([]reflect.Value, ft.NumIn())
			for j := range args {
				switch ft.In(j).Kind() {
				case reflect.Int:
					args[j] = reflect.ValueOf(7)
				case reflect.String:
					args[j] = reflect.ValueOf("<>")
				default:
					t.Fatalf("%s%s takes a %s", prefix, mt.Name, ft.In(j))
				}
			}
			name := m.Call(args)[0].String()
			out[tag.ReplaceAllString(name, "{p}")] = prefix + mt.Name
		}
	}
	builders(reflect.ValueOf(k), "")
	builders(reflect.ValueOf(k.Staged()), "Staged.")
	// The builders only the scripts' KEYS use, unexported.
	out[tag.ReplaceAllString(k.cartIdempotency(7, "<>"), "{p}")] = "cartIdempotency"
	out[tag.ReplaceAllString(k.idempotencyClaims("<>"), "{p}")] = "idempotencyClaims"
	return out
}

// TestTheLayoutTableIsTheKeys checks inventory/doc.go's key layout table
// against Keys: each name the table lists is one Keys builds, and each name
// Keys builds is in the table.
func TestTheLayoutTableIsTheKeys(t *testing.T) {
	doc, err := os.ReadFile("../doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^//\t(dl:\{p(?:\d\d|NN)\}:\S+)\s+(hash|zset|stream|string|sharded)\b`)
	placeholder := regexp.MustCompile(`<[a-z]+>`)
	tag := regexp.MustCompile(`\{p(?:\d\d|NN)\}`)
	built := builtNames(t)
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		name := tag.ReplaceAllString(placeholder.ReplaceAllString(m[1], "<>"), "{p}")
		listed[name] = true
		if _, ok := built[name]; !ok {
			t.Errorf("doc.go lists %s, which Keys does not build", m[1])
		}
	}
	if len(listed) < 10 {
		t.Fatalf("found only %d rows of the layout table in doc.go", len(listed))
	}
	var missing []string
	for name, method := range built {
		if !listed[name] {
			missing = append(missing, method+" ("+name+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("doc.go's layout table lacks %s", strings.Join(missing, ", "))
	}
}

// libKeyBuilders says which Keys builder each key-deriving helper of
// lib.lua must agree with, field by field; "" is a helper returning one
// name. (pass_keys builds the admission queue's keys, which package
// inventory/queue lays out.)
var libKeyBuilders = map[string]map[string]string{
	"hold_key":  {"": "Hold"},
	"idem_key":  {"": "Idempotency"},
	"cart_key":  {"": "Cart"},
	"drop_key":  {"": "Drop"},
	"walks_key": {"": "Walks"},
	"sku_keys":  {"sku": "SKU", "quota": "Quota", "channel": "Channel"},
	"wait_keys": {"queue": "WaitQueue", "entries": "WaitEntries"},
}

// TestLibDerivesKeysAsKeysDoes reads the key helpers of lib.lua (base ..
// 'hold:' .. token, and tables of such) and checks that each builds the
// name the matching Keys builder does: the layout is written in keys.go,
// and lib.lua's copy of it is held to it here.
func TestLibDerivesKeysAsKeysDoes(t *testing.T) {
	src := code(readLua(t, "lib"))
	fn := regexp.MustCompile(`(?s)local function (\w+)\(base(?:, (\w+))?\)\s*return (.*?)\nend`)
	field := regexp.MustCompile(`(\w+) = ([^,}]+)`)
	built := builtNames(t)
	byMethod := map[string]string{}
	for name, m := range built {
		byMethod[m] = name
	}
	// eval renders base .. 'lit' .. arg as a built name.
	eval := func(expr, arg string) string {
		var b strings.Builder
		for _, part := range strings.Split(expr, "..") {
			part = strings.TrimSpace(part)
			switch {
			case part == "base":
				b.WriteString("dl:{p}:")
			case part == arg:
				b.WriteString("<>")
			case strings.HasPrefix(part, "'") && strings.HasSuffix(part, "'"):
				b.WriteString(strings.Trim(part, "'"))
			default:
				t.Fatalf("cannot read %q in lib.lua", part)
			}
		}
		return b.String()
	}
	seen := map[string]bool{}
	for _, m := range fn.FindAllStringSubmatch(src, -1) {
		want, ok := libKeyBuilders[m[1]]
		if !ok {
			continue
		}
		seen[m[1]] = true
		got := map[string]string{}
		body := strings.TrimSpace(m[3])
		if strings.HasPrefix(body, "{") {
			for _, f := range field.FindAllStringSubmatch(body, -1) {
				got[f[1]] = eval(f[2], m[2])
			}
		} else {
			got[""] = eval(body, m[2])
		}
		var fields []string
		for f := range got {
			fields = append(fields, f)
		}
		var wantFields []string
		for f := range want {
			wantFields = append(wantFields, f)
		}
		sort.Strings(fields)
		sort.Strings(wantFields)
		if !slices.Equal(fields, wantFields) {
			t.Errorf("lib.lua's %s builds %v; Keys has %v", m[1], fields, wantFields)
			continue
		}
		for f, method := range want {
			if got[f] != byMethod[method] {
				t.Errorf("lib.lua's %s %s is %s; Keys.%s builds %s", m[1], f, got[f], method, byMethod[method])
			}
		}
	}
	for h := range libKeyBuilders {
		if !seen[h] {
			t.Errorf("lib.lua has no %s(base, ...) returning its key", h)
		}
	}
}
