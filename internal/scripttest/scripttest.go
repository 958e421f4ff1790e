// Package scripttest holds Redis-script calls to their scripts' headers in
// tests: a redis.Hook records every EVALSHA or EVAL of the scripts a test
// names, and Check compares each recorded call's KEYS and ARGV with what the
// script's opening comment says of them (key shapes, counts, one hash tag,
// every script and mode exercised). The engine's typed calls are checked
// without Redis in inventory/script; the queue's and the lease's, whose
// calls are built inside their packages, are recorded here.
package scripttest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/lua"
)

// luaDir is the scripts' folder, found from this file.
var luaDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "lua") + "/"
}()

// Call is one EVALSHA or EVAL a client sent of a script it knows.
type Call struct {
	Script     string
	Keys, Argv []string
	err        string // what kept the call from being read, if anything
}

// Recorder is a redis.Hook that records the calls of some scripts:
// by their hash (EVALSHA), or by their source (EVAL, after NOSCRIPT).
type Recorder struct {
	byHash, bySource map[string]string
	mu               sync.Mutex
	calls            []Call
}

// NewRecorder records the calls of the scripts names (lua's names).
func NewRecorder(names []string) *Recorder {
	r := &Recorder{byHash: map[string]string{}, bySource: map[string]string{}}
	for _, name := range names {
		src := lua.MustSource(name)
		r.byHash[redis.NewScript(src).Hash()] = name
		r.bySource[src] = name
	}
	return r
}

// DialHook leaves dialing alone.
func (r *Recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook records a command that runs one of the scripts.
func (r *Recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook records each such command of a pipeline.
func (r *Recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (r *Recorder) record(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 3 {
		return
	}
	var name string
	switch cmd.Name() {
	case "evalsha", "evalsha_ro":
		name = r.byHash[fmt.Sprint(args[1])]
	case "eval", "eval_ro":
		name = r.bySource[fmt.Sprint(args[1])]
	}
	if name == "" {
		return
	}
	c := Call{Script: name}
	n, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || n < 0 || 3+n > len(args) {
		c.err = fmt.Sprintf("numkeys %v of %d arguments", args[2], len(args)-3)
	} else {
		for _, a := range args[3 : 3+n] {
			c.Keys = append(c.Keys, fmt.Sprint(a))
		}
		for _, a := range args[3+n:] {
			c.Argv = append(c.Argv, fmt.Sprint(a))
		}
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

// Taken is what was recorded so far.
func (r *Recorder) Taken() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// contract is what a script's header says of its KEYS and ARGV.
type contract struct {
	// keys are the shapes each KEYS[n] may have: the one the header names,
	// or its alternatives (a shape alone on the line after KEYS[n]'s).
	keys  map[int][]string
	nkeys int // the highest KEYS[n] the header names
	// argv is the highest fixed ARGV[n] by mode: "" for the ARGV of every
	// call, a name for those of the calls whose ARGV[1] is that name (a
	// header line "name: ARGV[n] ..." and the lines indented under it).
	argv map[string]int
	// tails is where a variable tail (ARGV[n..]) starts, by mode.
	tails map[string]int
	// base is the ARGV[n] the header gives as the partition base, or 0.
	base int
}

var (
	contractKey  = regexp.MustCompile(`KEYS\[(\d+)\]\s+(\S+)`)
	contractArgv = regexp.MustCompile(`ARGV\[(\d+)\]`)
	contractTail = regexp.MustCompile(`ARGV\[(\d+)\.\.\]`)
	contractBase = regexp.MustCompile(`ARGV\[(\d+)\]\s+partition base`)
	contractMode = regexp.MustCompile(`^\s*([a-z]+):\s+ARGV\[`)
)

// readContract reads the header of lua/<name>.lua: its opening comment.
func readContract(t testing.TB, name string) contract {
	t.Helper()
	src, err := os.ReadFile(luaDir + name + ".lua")
	require.NoError(t, err)
	c := contract{keys: map[int][]string{}, argv: map[string]int{"": 0}, tails: map[string]int{}}
	mode, last := "", 0
	for _, line := range strings.Split(string(src), "\n") {
		body, ok := strings.CutPrefix(line, "--")
		if !ok {
			break
		}
		switch m := contractMode.FindStringSubmatch(body); {
		case m != nil:
			mode = m[1]
			c.argv[mode] = 0
		case strings.TrimSpace(body) == "", !strings.HasPrefix(body, "  "):
			mode = "" // a blank line or a line of its own ends a mode's lines
		}
		if strings.TrimSpace(body) == "" {
			last = 0
		}
		named := contractKey.FindAllStringSubmatch(body, -1)
		for _, m := range named {
			n, _ := strconv.Atoi(m[1])
			c.keys[n] = append(c.keys[n], m[2])
			c.nkeys, last = max(c.nkeys, n), n
		}
		if f := strings.Fields(body); len(named) == 0 && last > 0 && len(f) > 0 && strings.HasPrefix(f[0], "{p") {
			c.keys[last] = append(c.keys[last], f[0])
		}
		for _, m := range contractArgv.FindAllStringSubmatch(body, -1) {
			n, _ := strconv.Atoi(m[1])
			c.argv[mode] = max(c.argv[mode], n)
		}
		if m := contractTail.FindStringSubmatch(body); m != nil {
			c.tails[mode], _ = strconv.Atoi(m[1])
		}
		if m := contractBase.FindStringSubmatch(body); m != nil {
			c.base, _ = strconv.Atoi(m[1])
		}
	}
	return c
}

// keyShape turns a header's key, such as {p}qwho:<queue> or
// {p00}members:<kind>, into a regular expression over the key the caller
// builds under prefix ({p}: any partition; {pNN}: partition NN), and the
// names of its placeholders, one group each.
func keyShape(prefix, shape string) (*regexp.Regexp, []string, error) {
	tag := regexp.MustCompile(`^\{p(\d\d)?\}`).FindStringSubmatch(shape)
	if tag == nil {
		return nil, nil, fmt.Errorf("%s opens with no {p} or {pNN} tag", shape)
	}
	var b strings.Builder
	b.WriteString("^" + regexp.QuoteMeta(prefix))
	if tag[1] != "" {
		b.WriteString(regexp.QuoteMeta("{p" + tag[1] + "}:"))
	} else {
		b.WriteString(`\{p\d\d\}:`)
	}
	var names []string
	for _, part := range regexp.MustCompile(`<[a-z_]+>|[^<]+`).FindAllString(shape[len(tag[0]):], -1) {
		if strings.HasPrefix(part, "<") {
			b.WriteString(`([^{}]+)`)
			names = append(names, part)
		} else {
			b.WriteString(regexp.QuoteMeta(part))
		}
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	return re, names, err
}

// hashTag is the part of key Redis Cluster hashes: between its first { and
// the next }, when not empty.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}

// Check holds calls to the headers of the scripts names and
// returns what does not match: a KEYS[n] not of the header's shape, or one
// placeholder (<queue>, <kind>) with two values in one call; a KEYS count
// other than the header's; fewer ARGV than the header's fixed ones (of the
// call's mode), or a tail not a whole number of items (tails: the ARGV of
// one item, by script or "script mode"), or more ARGV than a header without
// a tail names; keys in more than one hash tag; an ARGV given as the
// partition base that is not the keys'. And what was never exercised: a
// script, an alternative key, a mode, a tail with items.
func Check(t testing.TB, names []string, tails map[string]int, prefix string, calls []Call) []string {
	t.Helper()
	var out []string
	contracts := map[string]contract{}
	seen := map[string]bool{}
	// Every key shape the headers give, so a key is read as the most
	// specific one it matches: {p}lease:<kind>:fence, not {p}lease:<kind>
	// with a kind of "sweeper:fence".
	type known struct {
		re      *regexp.Regexp
		holes   []string
		literal int
	}
	shapes := map[string]known{}
	for _, name := range names {
		c := readContract(t, name)
		contracts[name] = c
		for n, alternatives := range c.keys {
			for _, shape := range alternatives {
				re, holes, err := keyShape(prefix, shape)
				if err != nil {
					out = append(out, fmt.Sprintf("%s: KEYS[%d]: %v", name, n, err))
					continue
				}
				shapes[shape] = known{re: re, holes: holes, literal: len(shape) - len(strings.Join(holes, ""))}
			}
		}
	}
	for _, call := range calls {
		c, ok := contracts[call.Script]
		if !ok {
			continue
		}
		seen[call.Script] = true
		bad := func(format string, args ...any) {
			out = append(out, call.Script+": "+fmt.Sprintf(format, args...)+fmt.Sprintf(" (KEYS %q ARGV %q)", call.Keys, call.Argv))
		}
		if call.err != "" {
			bad("%s", call.err)
			continue
		}
		if len(call.Keys) != c.nkeys {
			bad("%d KEYS; the header names up to KEYS[%d]", len(call.Keys), c.nkeys)
		}
		values := map[string]string{}
		for n := 1; n <= min(len(call.Keys), c.nkeys); n++ {
			key, best := call.Keys[n-1], ""
			var m []string
			for shape, k := range shapes {
				more := best == "" || k.literal > shapes[best].literal || k.literal == shapes[best].literal && shape < best
				if got := k.re.FindStringSubmatch(key); got != nil && more {
					best, m = shape, got
				}
			}
			if !slices.Contains(c.keys[n], best) {
				bad("KEYS[%d] is %q; the header says %s", n, key, strings.Join(c.keys[n], " or "))
				continue
			}
			seen[fmt.Sprintf("%s KEYS[%d] %s", call.Script, n, best)] = true
			for i, hole := range shapes[best].holes {
				if v, ok := values[hole]; ok && v != m[i+1] {
					bad("KEYS[%d] %q has %s %q; an earlier key has %q", n, key, hole, m[i+1], v)
				}
				values[hole] = m[i+1]
			}
		}
		if len(call.Keys) > 0 {
			tag := hashTag(call.Keys[0])
			if tag == "" {
				bad("KEYS[1] %q has no hash tag", call.Keys[0])
			}
			for i, key := range call.Keys {
				if hashTag(key) != tag {
					bad("KEYS[%d] %q is not in KEYS[1]'s hash tag {%s}", i+1, key, tag)
				}
			}
			if c.base > 0 && c.base <= len(call.Argv) && call.Argv[c.base-1] != prefix+"{"+tag+"}:" {
				bad("ARGV[%d] is %q, not the partition base of its KEYS", c.base, call.Argv[c.base-1])
			}
		}
		mode, kind := "", call.Script
		if len(c.argv) > 1 {
			if len(call.Argv) > 0 {
				mode = call.Argv[0]
			}
			if _, ok := c.argv[mode]; !ok || mode == "" {
				bad("ARGV[1] %q names none of the header's modes", mode)
				continue
			}
			kind += " " + mode
			seen[kind] = true
		}
		fixed := max(c.argv[""], c.argv[mode])
		share := tails[kind]
		if start, ok := c.tails[mode]; ok && (share == 0 || start != fixed+1) {
			bad("the header's tail ARGV[%d..] follows ARGV[%d]; the test takes %d ARGV an item", start, fixed, share)
		}
		switch {
		case len(call.Argv) < fixed:
			bad("%d ARGV; the header names up to ARGV[%d]", len(call.Argv), fixed)
		case share == 0 && len(call.Argv) != fixed:
			bad("%d ARGV; the header names ARGV[1..%d] and no tail", len(call.Argv), fixed)
		case share > 0 && (len(call.Argv)-fixed)%share != 0:
			bad("%d ARGV: %d fixed and a tail that is not whole items of %d", len(call.Argv), fixed, share)
		case share > 0 && len(call.Argv) > fixed:
			seen[kind+" tail"] = true
		}
	}
	for _, name := range names {
		c := contracts[name]
		if !seen[name] {
			out = append(out, name+": never called")
			continue
		}
		for n, shapes := range c.keys {
			for _, shape := range shapes {
				if s := fmt.Sprintf("%s KEYS[%d] %s", name, n, shape); !seen[s] {
					out = append(out, s+": never called with that key")
				}
			}
		}
		for mode := range c.argv {
			if kind := name + " " + mode; mode != "" && !seen[kind] {
				out = append(out, kind+": never called in that mode")
			}
		}
	}
	for kind := range tails {
		if name, _, _ := strings.Cut(kind, " "); slices.Contains(names, name) && !seen[kind+" tail"] {
			out = append(out, kind+": never called with items in its ARGV's tail")
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
