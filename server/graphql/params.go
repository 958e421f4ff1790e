package graphql

import (
	"encoding/json"
	"hash/maphash"
	"sync/atomic"
	"unicode/utf16"
	"unicode/utf8"
)

// maxParamsDepth is how deeply decodeParams follows nested variables before
// it leaves the body to encoding/json.
const maxParamsDepth = 64

// decodeParams decodes a POST body into p without reflection, with what
// decodeJSON would give: numbers as json.Number, only the first JSON value
// read. It takes the shape clients send, an object of query,
// operationName, variables, extensions, documentId and doc_id, each at
// most once, spelled so,
// and strings that are valid UTF-8 without surrogate escapes. For anything
// else (or anything that is not JSON) it reports false and p may be half
// written: decodeJSON then decodes a fresh p and answers as it always has.
func decodeParams(b []byte, p *requestParams) bool {
	d := paramsDecoder{b: b}
	var seen [6]bool
	d.space()
	return d.members(func(key string) bool {
		i, str, obj := param(p, key)
		if i < 0 || seen[i] {
			return false
		}
		seen[i] = true
		if str != nil {
			if d.literal("null") {
				return true
			}
			s, ok := d.string(&decodedStrings)
			if !ok {
				return false
			}
			*str = s.(string)
			return true
		}
		var m map[string]any
		if !d.literal("null") {
			var ok bool
			if m, ok = d.object(1); !ok {
				return false
			}
		}
		*obj = m
		return true
	})
}

// param is the field of p that key names, a string or an object, and its
// place in decodeParams' seen; i is -1 for a key decodeParams leaves to
// encoding/json.
func param(p *requestParams, key string) (i int, str *string, obj *map[string]any) {
	switch key {
	case "query":
		return 0, &p.Query, nil
	case "operationName":
		return 1, &p.OperationName, nil
	case "variables":
		return 2, nil, &p.Variables
	case "extensions":
		return 3, nil, &p.Extensions
	case "documentId":
		return 4, &p.DocumentID, nil
	case "doc_id":
		return 5, &p.DocID, nil
	}
	return -1, nil, nil
}

// paramsDecoder reads JSON from b at i; every method reports false, and
// decodeParams gives up, on what it does not take.
type paramsDecoder struct {
	b []byte
	i int
}

func (d *paramsDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *paramsDecoder) consume(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *paramsDecoder) literal(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

func (d *paramsDecoder) value(depth int) (any, bool) {
	if d.i >= len(d.b) {
		return nil, false
	}
	switch c := d.b[d.i]; {
	case c == '"':
		return d.string(&decodedValues)
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '-' || c >= '0' && c <= '9':
		n, ok := d.number()
		if !ok {
			return nil, false
		}
		return intern[json.Number](&decodedNumbers, n), true
	case d.literal("true"):
		return true, true
	case d.literal("false"):
		return false, true
	case d.literal("null"):
		return nil, true
	}
	return nil, false
}

func (d *paramsDecoder) object(depth int) (map[string]any, bool) {
	if depth > maxParamsDepth {
		return nil, false
	}
	m := map[string]any{}
	if !d.members(func(k string) bool {
		v, ok := d.value(depth)
		m[k] = v
		return ok
	}) {
		return nil, false
	}
	return m, true
}

// members reads an object from its '{' to its '}', handing each key to
// member, which reads the key's value after the colon.
func (d *paramsDecoder) members(member func(key string) bool) bool {
	if !d.consume('{') {
		return false
	}
	d.space()
	if d.consume('}') {
		return true
	}
	for {
		d.space()
		s, ok := d.string(&decodedStrings)
		key, _ := s.(string)
		if !ok {
			return false
		}
		d.space()
		if !d.consume(':') {
			return false
		}
		d.space()
		if !member(key) {
			return false
		}
		d.space()
		if d.consume('}') {
			return true
		}
		if !d.consume(',') {
			return false
		}
	}
}

func (d *paramsDecoder) array(depth int) ([]any, bool) {
	if depth > maxParamsDepth || !d.consume('[') {
		return nil, false
	}
	a := []any{}
	d.space()
	if d.consume(']') {
		return a, true
	}
	for {
		d.space()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		d.space()
		if d.consume(']') {
			return a, true
		}
		if !d.consume(',') {
			return nil, false
		}
	}
}

// number takes a JSON number as its text, as json.Decoder.UseNumber does.
// number takes a JSON number and returns its text.
func (d *paramsDecoder) number() ([]byte, bool) {
	start := d.i
	d.consume('-')
	switch {
	case d.consume('0'):
	case d.digits() == 0:
		return nil, false
	}
	if d.consume('.') && d.digits() == 0 {
		return nil, false
	}
	if d.consume('e') || d.consume('E') {
		if !d.consume('+') {
			d.consume('-')
		}
		if d.digits() == 0 {
			return nil, false
		}
	}
	return d.b[start:d.i], true
}

func (d *paramsDecoder) digits() int {
	n := 0
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
		n++
	}
	return n
}

// string takes a JSON string whose bytes are valid UTF-8 and whose escapes
// name no surrogate: what encoding/json would decode to the same text
// without replacing anything, as an interface value holding a string. A
// string without escapes is the copy t keeps of it: decodedStrings for
// the members' names, and the request's document, operation name and
// document id, decodedValues for the variables' values.
func (d *paramsDecoder) string(t *internTable) (any, bool) {
	if !d.consume('"') {
		return nil, false
	}
	start := d.i
	var out []byte // nil until an escape needs it
	ascii := true
	for {
		d.i = plainEnd(d.b, d.i)
		if d.i >= len(d.b) {
			return nil, false
		}
		switch c := d.b[d.i]; {
		case c >= utf8.RuneSelf:
			ascii = false // checked as UTF-8 once the string ends
			d.i++
		case c == '"':
			if out == nil {
				raw := d.b[start:d.i]
				d.i++
				if !ascii && !utf8.Valid(raw) {
					return nil, false
				}
				return intern[string](t, raw), true
			}
			s := string(append(out, d.b[start:d.i]...))
			d.i++
			if !ascii && !utf8.ValidString(s) {
				return nil, false
			}
			return s, true
		case c < 0x20:
			return nil, false
		case c == '\\':
			out = append(out, d.b[start:d.i]...)
			d.i++
			if d.i >= len(d.b) {
				return nil, false
			}
			e := d.b[d.i]
			d.i++
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := d.hex4()
				if !ok || utf16.IsSurrogate(r) {
					return nil, false
				}
				out = utf8.AppendRune(out, r)
			default:
				return nil, false
			}
			start = d.i
		}
	}
}

// plainEnd is the index of the first byte of b from i on that is not an
// ASCII character a JSON string holds as it is (a control character, a
// quote, a backslash, or a byte of a longer UTF-8 sequence), or len(b).
func plainEnd(b []byte, i int) int {
	for i < len(b) && plainStringByte[b[i]] {
		i++
	}
	return i
}

// plainStringByte marks the ASCII characters a JSON string holds as they
// are.
var plainStringByte = func() (plain [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		plain[c] = c != '"' && c != '\\'
	}
	return plain
}()

func (d *paramsDecoder) hex4() (rune, bool) {
	if len(d.b)-d.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	d.i += 4
	return r, true
}

// decodedStrings keeps one copy of the strings requests send again and
// again (paramsDecoder.string's interned ones): a client sends the same
// few documents, with variables of the same names, so a request's strings
// need no allocation of their own once a request has sent them.
// decodedValues and decodedNumbers keep the variables' strings and
// numbers apart from them (a request of new values then takes no slot of
// a document's): the storm's buyers send the same SKU and quantity.
var (
	decodedStrings = internTable{seed: maphash.MakeSeed()}
	decodedValues  = internTable{seed: maphash.MakeSeed()}
	decodedNumbers = internTable{seed: maphash.MakeSeed()}
)

// internTable keeps at most one value in each of its slots, the slot of
// its text's hash, as the interface value a request's parameters hold: a
// value found in its slot is given as that copy, any other is made and
// takes the slot. Finding one takes no lock (every request looks its
// values up, on every core), and what it keeps is bounded (internSlots
// values of at most internMaxLen bytes); requests of ever new values cost
// a value's copy each, as without the table. A table keeps values of one
// type (intern's T), as atomic.Value asks.
type internTable struct {
	seed  maphash.Seed
	slots [internSlots]atomic.Value
}

const (
	internSlots  = 1024
	internMaxLen = 2 << 10
)

// intern returns b as a T, the table's copy when it has one.
func intern[T string | json.Number](t *internTable, b []byte) any {
	if len(b) > internMaxLen {
		return T(b)
	}
	slot := &t.slots[maphash.Bytes(t.seed, b)%internSlots]
	v := slot.Load()
	if kept, ok := v.(T); ok && string(kept) == string(b) {
		return v
	}
	v = T(b)
	slot.Store(v)
	return v
}
