package lua

import (
	"regexp"
	"strings"
)

// Redis runs a script's whole text on every call: each of the library's
// definitions (policyLua's tables, lib.lua's locals) is made anew each time,
// a closure or a table, and collected after. A script that uses a few of
// them pays for all, and that was most of what an EVALSHA of a short batch
// cost Redis. So a script carries only the definitions its body reaches,
// directly or through the definitions it keeps, in the library's order.

// definition is one top-level definition of the library: the text from
// its "local" line to the next one's, and the names it defines.
type definition struct {
	text  string
	names []string
}

var (
	localFunction = regexp.MustCompile(`^local function ([A-Za-z_][A-Za-z0-9_]*)`)
	localNames    = regexp.MustCompile(`^local ([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*=`)
)

// definitions cuts the library at each line that opens with "local " (a
// definition at the top level: a function's body is indented). The text
// before the first is returned apart (comments).
func definitions(lib string) (head string, defs []definition) {
	lines := strings.SplitAfter(lib, "\n")
	var cur *definition
	var b strings.Builder
	flush := func() {
		if cur == nil {
			head = b.String()
		} else {
			cur.text = b.String()
			defs = append(defs, *cur)
		}
		b.Reset()
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "local ") {
			flush()
			cur = &definition{}
			if m := localFunction.FindStringSubmatch(l); m != nil {
				cur.names = []string{m[1]}
			} else if m := localNames.FindStringSubmatch(l); m != nil {
				for _, n := range strings.Split(m[1], ",") {
					cur.names = append(cur.names, strings.TrimSpace(n))
				}
			}
		}
		b.WriteString(l)
	}
	flush()
	return head, defs
}

// references returns the names Lua code src uses: identifiers outside
// comments and strings, but for a field's name (after a single "." or
// ":") and a key of a table constructor (name = value, directly within
// braces). A name it returns that src does not use (a table constructor's key,
// a local of src's own) only keeps a definition that was not needed.
func references(src string) map[string]bool {
	refs := map[string]bool{}
	n := len(src)
	var open []byte // the brackets open at i: '{', '(' or '['
	inTable := func() bool { return len(open) > 0 && open[len(open)-1] == '{' }
	ident := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	// longBracket returns the end of a long bracket opened at i ("[[",
	// "[==["), or -1 when none opens there.
	longBracket := func(i int) int {
		if i >= n || src[i] != '[' {
			return -1
		}
		j := i + 1
		for j < n && src[j] == '=' {
			j++
		}
		if j >= n || src[j] != '[' {
			return -1
		}
		closer := "]" + strings.Repeat("=", j-i-1) + "]"
		k := strings.Index(src[j+1:], closer)
		if k < 0 {
			return n
		}
		return j + 1 + k + len(closer)
	}
	for i := 0; i < n; {
		c := src[i]
		switch {
		case c == '-' && i+1 < n && src[i+1] == '-':
			if e := longBracket(i + 2); e >= 0 {
				i = e
				continue
			}
			for i < n && src[i] != '\n' {
				i++
			}
		case c == '\'' || c == '"':
			i++
			for i < n && src[i] != c {
				if src[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case c == '[':
			if e := longBracket(i); e >= 0 {
				i = e
				continue
			}
			open = append(open, c)
			i++
		case c == '{' || c == '(':
			open = append(open, c)
			i++
		case c == '}' || c == ')' || c == ']':
			if len(open) > 0 {
				open = open[:len(open)-1]
			}
			i++
		case ident(c) && (c < '0' || c > '9'):
			j := i
			for j < n && ident(src[j]) {
				j++
			}
			field := i > 0 && (src[i-1] == '.' || src[i-1] == ':') && (i <= 1 || src[i-1] != '.' || src[i-2] != '.')
			k := j
			for k < n && (src[k] == ' ' || src[k] == '\t' || src[k] == '\n') {
				k++
			}
			key := inTable() && k+1 < n && src[k] == '=' && src[k+1] != '='
			if !field && !key {
				refs[src[i:j]] = true
			}
			i = j
		case c >= '0' && c <= '9':
			for i < n && (ident(src[i]) || src[i] == '.') {
				i++
			}
		default:
			i++
		}
	}
	return refs
}

// shake returns the library's text with only the definitions body needs.
func shake(lib, body string) string {
	head, defs := definitions(lib)
	byName := map[string]int{}
	for i, d := range defs {
		for _, n := range d.names {
			byName[n] = i
		}
	}
	keep := make([]bool, len(defs))
	var queue []int
	need := func(refs map[string]bool) {
		for r := range refs {
			if i, ok := byName[r]; ok && !keep[i] {
				keep[i] = true
				queue = append(queue, i)
			}
		}
	}
	need(references(body))
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		need(references(defs[i].text))
	}
	var b strings.Builder
	b.WriteString(head)
	for i, d := range defs {
		// A definition whose names were not read (none of the forms
		// above) is kept, as are those the body reaches.
		if keep[i] || len(d.names) == 0 {
			b.WriteString(d.text)
		}
	}
	return b.String()
}
