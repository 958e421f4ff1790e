package graphql

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// readAll reads what io.ReadAll reads, in one allocation of the body's
// size (and the byte of the read that finds its end) when its length is
// declared.
func TestReadAllIsIOReadAll(t *testing.T) {
	for _, n := range []int{0, 1, 211, 511, 512, 513, 4096, 64 << 10, 64<<10 + 1, 200 << 10} {
		body := strings.Repeat("x", n)
		for name, reader := range map[string]func() io.Reader{
			"plain":    func() io.Reader { return strings.NewReader(body) },
			"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
			"data+EOF": func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
		} {
			want, err := io.ReadAll(reader())
			require.NoError(t, err)
			for _, length := range []int64{int64(n), -1} {
				got, err := readAll(reader(), length)
				require.NoError(t, err, "%d bytes, %s, length %d", n, name, length)
				require.Equal(t, want, got, "%d bytes, %s, length %d", n, name, length)
				if length >= 0 && n <= 64<<10 {
					require.Equal(t, n+1, cap(got), "%d bytes, %s: room for the body and its end only", n, name)
				}
			}
		}
	}
	boom := errors.New("boom")
	got, err := readAll(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 10)
	require.ErrorIs(t, err, boom)
	require.Equal(t, []byte("abc"), got)
	_, err = readAll(bytes.NewReader(nil), 0)
	require.NoError(t, err)
}
