package auth_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dropline/dropline/auth"
)

// FuzzVerify feeds arbitrary strings to Issuer.Verify: every refusal wraps
// ErrTokenExpired or ErrTokenInvalid, nothing panics, and whatever is
// accepted carries a valid principal and verifies the same way twice.
func FuzzVerify(f *testing.F) {
	secret := []byte(strings.Repeat("f", 32))
	iss, err := auth.NewIssuer(secret)
	if err != nil {
		f.Fatal(err)
	}
	valid, _ := iss.Mint("fuzzer", false, time.Hour)
	admin, _ := iss.Mint("ops", true, time.Hour)
	expired, _ := iss.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }).Mint("fuzzer", false, time.Hour)
	other, _ := auth.NewIssuer([]byte(strings.Repeat("o", 32)))
	wrong, _ := other.Mint("fuzzer", true, time.Hour)
	b64 := base64.RawURLEncoding.EncodeToString
	none := b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64([]byte(`{"sub":"x","role":"admin","exp":4102444800}`)) + "."
	hs512 := b64([]byte(`{"alg":"HS512","typ":"JWT"}`)) + "." + b64([]byte(`{"sub":"x","exp":4102444800}`)) + ".c2ln"
	for _, s := range []string{valid, admin, expired, wrong, none, hs512, "", ".", "..", "a.b.c", "Bearer " + valid,
		valid + "x", strings.Replace(valid, ".", "..", 1), b64([]byte(`{"alg":"HS256"}`)) + ".e30.", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		p, err := iss.Verify(token)
		if err != nil {
			if !errors.Is(err, auth.ErrTokenExpired) && !errors.Is(err, auth.ErrTokenInvalid) {
				t.Fatalf("untyped refusal: %v", err)
			}
			if len(token) > 20 && strings.Contains(err.Error(), token) {
				t.Fatalf("the error quotes the token: %v", err)
			}
			return
		}
		if auth.ValidatePrincipalID(p.ID) != nil {
			t.Fatalf("accepted an invalid principal %q", p.ID)
		}
		q, err := iss.Verify(token)
		if err != nil || q != p {
			t.Fatalf("verifying twice differs: %+v %v", q, err)
		}
		if _, err := other.Verify(token); err == nil {
			t.Fatalf("a token accepted under two secrets")
		}
	})
}
