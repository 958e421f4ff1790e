// Package auth identifies who is calling Dropline: it mints and verifies
// HS256 bearer tokens and carries the verified Principal in the request
// context.
//
// A token is a JWT signed with DROPLINE_JWT_SECRET whose "sub" is the
// principal ID, whose "exp" is required, and whose optional claim
// "role":"admin" grants admin rights. Only HS256 is accepted, so "alg":"none"
// and algorithm-confusion tokens are rejected before any claim is read.
// Optionally (IssuerConfig) "iss" and "aud" must name this deployment, and a
// token may not be valid for longer than a maximum lifetime, so a token
// minted for another system sharing the secret, or a long-lived one, is
// refused. A token whose header or claims name one key twice is refused
// whatever its signature: JSON decoders disagree on which of two "role"
// values counts, and the one that signed it may have meant the other.
//
// A request without a token is anonymous. A request with a bad token is not
// silently downgraded to anonymous: Middleware refuses it with 401 before
// anything runs.
package auth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Sentinel errors. Callers match them with errors.Is to pick the error code
// shown to clients; the wrapped detail is for logs only.
var (
	// ErrTokenExpired means the token was valid once but its "exp" has passed:
	// the client should obtain a new token.
	ErrTokenExpired = errors.New("token expired")
	// ErrTokenInvalid means the token is malformed, badly signed, uses
	// another algorithm, lacks a required claim or names an invalid
	// principal: it must never be trusted.
	ErrTokenInvalid = errors.New("token invalid")
	// ErrInvalidPrincipal means a principal ID is outside 1–128 characters
	// of [A-Za-z0-9._@-], so it cannot be put into keys and logs safely.
	ErrInvalidPrincipal = errors.New("invalid principal id")
	// ErrDuplicateClaim means a token's header or claims name one key
	// twice ({"role":"buyer","role":"admin"}); it wraps into
	// ErrTokenInvalid.
	ErrDuplicateClaim = errors.New("a claim is named twice")
	// ErrSecretTooShort means the signing secret is shorter than
	// MinSecretLen bytes.
	ErrSecretTooShort = errors.New("jwt secret too short")
)

// MinSecretLen is the shortest accepted HS256 secret in bytes: an HMAC key
// shorter than the SHA-256 output weakens the signature.
const MinSecretLen = 32

// MaxPrincipalLen bounds principal IDs; they end up in Redis keys.
const MaxPrincipalLen = 128

// RoleAdmin is the "role" claim value that grants admin rights (cancelling
// any reservation, managing products and stock).
const RoleAdmin = "admin"

// issuerName is written to "iss" so a token says where it came from, when no
// issuer is configured.
const issuerName = "dropline"

// leeway absorbs clock skew between the machine that minted a token and the
// one verifying it.
const leeway = 5 * time.Second

// Principal is a verified caller. The zero value is the anonymous caller.
type Principal struct {
	// ID is the token's subject, already validated with ValidatePrincipalID.
	ID string
	// Admin is true when the token carries role "admin".
	Admin bool
	// ExpiresAt is when the token stops being accepted.
	ExpiresAt time.Time
}

// ValidatePrincipalID checks that id has 1–MaxPrincipalLen characters of
// [A-Za-z0-9._@-]. Principal IDs become parts of Redis keys and log fields,
// so anything that could split a key or forge a log line is refused.
func ValidatePrincipalID(id string) error {
	if id == "" || len(id) > MaxPrincipalLen {
		return fmt.Errorf("%w: must be 1-%d characters", ErrInvalidPrincipal, MaxPrincipalLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '@' || c == '-'
		if !ok {
			return fmt.Errorf("%w: only letters, digits and . _ @ - are allowed", ErrInvalidPrincipal)
		}
	}
	return nil
}

// claims is the token body Dropline writes and reads.
type claims struct {
	Role string `json:"role,omitempty"`
	jwt.RegisteredClaims
}

// IssuerConfig is what an Issuer signs with and checks. Zero values take the
// defaults named on each field.
type IssuerConfig struct {
	// Secret is the HS256 key, at least MinSecretLen bytes. It is copied.
	Secret []byte
	// Issuer, when set (DROPLINE_JWT_ISSUER), is written to "iss" and
	// required in every token verified. Default: empty, which mints
	// "iss":"dropline" and accepts any issuer.
	Issuer string
	// Audience, when set (DROPLINE_JWT_AUDIENCE), is written to "aud" and
	// required among a verified token's audiences. Default: empty, which
	// writes no audience and checks none.
	Audience string
	// MaxLifetime, when positive (DROPLINE_JWT_MAX_LIFETIME), refuses tokens
	// valid for longer: exp - iat above it, or exp still further than it
	// from now (beyond the clock-skew leeway). Mint refuses a longer ttl.
	// Default: 0, no limit.
	MaxLifetime time.Duration
}

// Issuer mints and verifies tokens with one HS256 secret. It is safe for
// concurrent use.
type Issuer struct {
	cfg    IssuerConfig
	now    func() time.Time
	parser *jwt.Parser
	cache  *verified
}

// verifiedCacheSize bounds the tokens an Issuer remembers as verified.
// Every request of a busy buyer carries the same token; checking its HMAC
// and decoding its claims again costs more than the rest of a sold-out
// answer. When full the cache starts over, so it never grows without bound.
const verifiedCacheSize = 32768

// verified remembers tokens that passed Verify, keyed by the whole token
// (signature included, so a token changed in any byte is another key),
// with the Principal they carry. A remembered token is good until its
// expiry plus the leeway, as it would be when parsed again: every other
// check Verify makes gives the same answer later (signature, issuer,
// audience, role, subject, issued-at) or only a better one (not-before, and
// the lifetime left before expiry only shrinks).
type verified struct {
	mu sync.Mutex
	m  map[string]Principal
}

func (v *verified) get(token string, now time.Time) (Principal, bool) {
	v.mu.Lock()
	p, ok := v.m[token]
	v.mu.Unlock()
	if !ok || !now.Before(p.ExpiresAt.Add(leeway)) {
		return Principal{}, false
	}
	return p, true
}

func (v *verified) put(token string, p Principal) {
	v.mu.Lock()
	if len(v.m) >= verifiedCacheSize {
		clear(v.m)
	}
	v.m[token] = p
	v.mu.Unlock()
}

// NewIssuer returns an Issuer for secret, which must be at least
// MinSecretLen bytes (config.Validate enforces the same rule with a
// friendlier message), with no issuer, audience or lifetime checks.
func NewIssuer(secret []byte) (*Issuer, error) {
	return NewIssuerWith(IssuerConfig{Secret: secret})
}

// NewIssuerWith returns an Issuer for cfg.
func NewIssuerWith(cfg IssuerConfig) (*Issuer, error) {
	if len(cfg.Secret) < MinSecretLen {
		return nil, fmt.Errorf("%w: %d bytes, need at least %d", ErrSecretTooShort, len(cfg.Secret), MinSecretLen)
	}
	if cfg.MaxLifetime < 0 {
		return nil, fmt.Errorf("max token lifetime must not be negative, got %s", cfg.MaxLifetime)
	}
	cfg.Secret = append([]byte(nil), cfg.Secret...)
	return newIssuer(cfg, time.Now), nil
}

func newIssuer(cfg IssuerConfig, now func() time.Time) *Issuer {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(now),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	return &Issuer{cfg: cfg, now: now, parser: jwt.NewParser(opts...), cache: &verified{m: map[string]Principal{}}}
}

// WithClock returns a copy of the Issuer that reads time from now, so tests
// can mint and verify tokens at chosen instants.
func (i *Issuer) WithClock(now func() time.Time) *Issuer {
	return newIssuer(i.cfg, now)
}

// MaxLifetime is the longest a token may be valid for; 0 when unlimited.
func (i *Issuer) MaxLifetime() time.Duration { return i.cfg.MaxLifetime }

// Mint returns a signed token for principalID, valid for ttl. The
// `dropline token` command and tests use it; production tokens may come
// from any system that shares the secret and the claim layout.
func (i *Issuer) Mint(principalID string, admin bool, ttl time.Duration) (string, error) {
	if err := ValidatePrincipalID(principalID); err != nil {
		return "", fmt.Errorf("minting token: %w", err)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("minting token: ttl must be positive, got %s", ttl)
	}
	if limit := i.cfg.MaxLifetime; limit > 0 && ttl > limit {
		return "", fmt.Errorf("minting token: ttl %s exceeds the maximum token lifetime %s", ttl, limit)
	}
	now := i.now()
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    issuerName,
			Subject:   principalID,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	if i.cfg.Issuer != "" {
		c.Issuer = i.cfg.Issuer
	}
	if i.cfg.Audience != "" {
		c.Audience = jwt.ClaimStrings{i.cfg.Audience}
	}
	if admin {
		c.Role = RoleAdmin
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(i.cfg.Secret)
	if err != nil {
		return "", fmt.Errorf("minting token: %w", err)
	}
	return s, nil
}

// Verify checks the signature, algorithm, expiry and claims of token and
// returns its Principal. Every failure wraps ErrTokenExpired or
// ErrTokenInvalid; the message never contains the token itself.
func (i *Issuer) Verify(token string) (Principal, error) {
	if p, ok := i.cache.get(token, i.now()); ok {
		return p, nil
	}
	p, err := i.verify(token)
	if err != nil {
		return Principal{}, err
	}
	i.cache.put(token, p)
	return p, nil
}

func (i *Issuer) verify(token string) (Principal, error) {
	var c claims
	_, err := i.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) {
		return i.cfg.Secret, nil
	})
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Principal{}, fmt.Errorf("verifying token: %w", ErrTokenExpired)
	case err != nil:
		return Principal{}, fmt.Errorf("verifying token: %w: %s", ErrTokenInvalid, reason(err))
	}
	if err := uniqueKeys(token); err != nil {
		return Principal{}, fmt.Errorf("verifying token: %w: %w", ErrTokenInvalid, err)
	}
	if err := ValidatePrincipalID(c.Subject); err != nil {
		return Principal{}, fmt.Errorf("verifying token: %w: bad subject: %s", ErrTokenInvalid, err.Error())
	}
	if limit := i.cfg.MaxLifetime; limit > 0 {
		exp := c.ExpiresAt.Time
		if exp.Sub(i.now()) > limit+leeway || (c.IssuedAt != nil && exp.Sub(c.IssuedAt.Time) > limit) {
			return Principal{}, fmt.Errorf("verifying token: %w: valid for longer than the maximum token lifetime", ErrTokenInvalid)
		}
	}
	p := Principal{ID: c.Subject, ExpiresAt: c.ExpiresAt.Time}
	switch c.Role {
	case "":
	case RoleAdmin:
		p.Admin = true
	default:
		return Principal{}, fmt.Errorf("verifying token: %w: unknown role", ErrTokenInvalid)
	}
	return p, nil
}

// reason shortens a jwt error to the first sentinel it matches, so logs say
// "signature is invalid" rather than a chain of parser internals.
func reason(err error) string {
	for _, s := range []error{
		jwt.ErrTokenMalformed, jwt.ErrTokenSignatureInvalid, jwt.ErrTokenUnverifiable,
		jwt.ErrTokenRequiredClaimMissing, jwt.ErrTokenNotValidYet, jwt.ErrTokenUsedBeforeIssued,
		jwt.ErrTokenInvalidIssuer, jwt.ErrTokenInvalidAudience, jwt.ErrTokenInvalidClaims,
	} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "unverifiable token"
}

// uniqueKeys refuses a token (one the parser accepted, so its segments are
// base64url JSON) whose header or claims name a key twice, at any depth.
// encoding/json, and so the parser, keeps the last of two values; other
// JWT libraries keep the first or refuse, so such a token means different
// things to different readers and is never what an honest issuer writes.
func uniqueKeys(token string) error {
	header, rest, _ := strings.Cut(token, ".")
	payload, _, _ := strings.Cut(rest, ".")
	for _, seg := range []string{header, payload} {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(seg, "="))
		if err != nil {
			return fmt.Errorf("%w: unreadable segment", ErrDuplicateClaim)
		}
		if key, dup := duplicateKey(b); dup {
			return fmt.Errorf("%w: %q", ErrDuplicateClaim, key)
		}
	}
	return nil
}

// duplicateKey returns the first key named twice in one object of the JSON
// document b. A document it cannot read has none: the parser has read it.
// It walks b by hand (a token's claims are a few short keys, and
// encoding/json's tokenizer cost more than the rest of the check); a key
// that is not plain ASCII or has an escape is decoded by encoding/json, so
// two keys are the same exactly when the parser reads them the same.
func duplicateKey(b []byte) (string, bool) {
	d := dupScanner{b: b}
	d.value(0)
	if d.deep {
		return duplicateKeyByTokens(b)
	}
	return d.dup, d.found
}

// duplicateKeyByTokens is duplicateKey by encoding/json's tokenizer, for a
// document nested deeper than the walk follows.
func duplicateKeyByTokens(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		object bool
		keys   map[string]bool
		key    bool // the next token of an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *frame
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		if top != nil && top.object && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				continue
			}
			k, _ := tok.(string)
			if top.keys[k] {
				return k, true
			}
			top.keys[k] = true
			top.key = false
			continue
		}
		if top != nil && top.object {
			top.key = true // this token is the value; a key comes next
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			return "", false
		}
	}
}

// dupScanner is duplicateKey's walk: i is the next byte; bad ends it
// without a duplicate, found with one (dup).
type dupScanner struct {
	b     []byte
	i     int
	bad   bool
	deep  bool // nested deeper than maxDupDepth
	found bool
	dup   string
}

// maxDupDepth bounds the nesting the walk follows; deeper goes to the
// tokenizer.
const maxDupDepth = 64

func (d *dupScanner) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// stop says the walk is over: unreadable, or a duplicate found.
func (d *dupScanner) stop() bool { return d.bad || d.found }

func (d *dupScanner) value(depth int) {
	d.ws()
	if d.i >= len(d.b) || depth > maxDupDepth {
		d.bad, d.deep = true, depth > maxDupDepth
		return
	}
	switch d.b[d.i] {
	case '{', '[':
		d.list(depth)
	case '"':
		d.str()
	default: // a number, true, false or null: up to the next delimiter
		for d.i < len(d.b) {
			switch d.b[d.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return
			}
			d.i++
		}
	}
}

// str skips a string and returns it as written, quotes included, and
// whether it is plain (ASCII, no escape: its bytes are its value).
func (d *dupScanner) str() (raw []byte, plain bool) {
	start := d.i
	d.i++ // the opening quote
	plain = true
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			return d.b[start:d.i], plain
		case c == '\\':
			plain = false
			d.i += 2
		case c >= 0x80 || c < 0x20:
			plain = false
			d.i++
		default:
			d.i++
		}
	}
	d.bad = true
	return nil, false
}

// list walks an array's items, or an object's keys and values, up to its
// closing bracket.
func (d *dupScanner) list(depth int) {
	object, end := d.b[d.i] == '{', byte(']')
	if object {
		end = '}'
	}
	d.i++
	var keys []string
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == end {
		d.i++
		return
	}
	for !d.stop() {
		if object {
			k := d.key()
			if d.bad {
				return
			}
			if slices.Contains(keys, k) {
				d.dup, d.found = k, true
				return
			}
			keys = append(keys, k)
		}
		d.value(depth + 1)
		d.ws()
		switch {
		case d.stop():
		case d.i < len(d.b) && d.b[d.i] == ',':
			d.i++
		case d.i < len(d.b) && d.b[d.i] == end:
			d.i++
			return
		default:
			d.bad = true
		}
	}
}

// key reads an object member's key and the colon after it.
func (d *dupScanner) key() string {
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		d.bad = true
		return ""
	}
	raw, plain := d.str()
	if d.bad {
		return ""
	}
	var k string
	if plain {
		k = string(raw[1 : len(raw)-1])
	} else if err := json.Unmarshal(raw, &k); err != nil {
		d.bad = true
		return ""
	}
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != ':' {
		d.bad = true
		return ""
	}
	d.i++
	return k
}
