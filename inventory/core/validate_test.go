package core

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// ValidSKU and ValidPrincipal, checked byte by byte, accept exactly what
// their patterns say: every single byte, every length around the limits,
// runes outside ASCII, a trailing newline, and random strings of the
// characters around the allowed ones.
func TestNamesAreCheckedAsTheirPatternsSay(t *testing.T) {
	sku := regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	principal := regexp.MustCompile(`^[A-Za-z0-9._@-]{1,128}$`)
	cases := []string{"", "a\n", "\na", "é", "aé", "a b", "a@b", "A-Z_0.9", "a\x00"}
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	for _, n := range []int{1, 63, 64, 65, 127, 128, 129} {
		cases = append(cases, strings.Repeat("a", n), strings.Repeat("@", n))
	}
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ09._-@/:+ \xff"
	for i := 0; i < 5000; i++ {
		b := make([]byte, r.IntN(140))
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		require.Equal(t, sku.MatchString(s), ValidSKU(s), "SKU %q", s)
		require.Equal(t, principal.MatchString(s), ValidPrincipal(s), "principal %q", s)
	}
}
