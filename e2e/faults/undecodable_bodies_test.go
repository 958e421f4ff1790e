package faults

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bodies gqlgen cannot decode reach the response hooks with no operation
// context; they must get a clear 4xx, never an internal error or a panic.
func TestUndecodableBodies(t *testing.T) {
	s := newSystem(t)
	p := s.start("a")
	for _, body := range []string{`{{`, `not json`, `{"query":"{ __typename }","variables":[]}`, `{"query":"{ __typename }","variables":"x"}`} {
		r := postRaw(context.Background(), quickClient, p.URL, "", "application/json", []byte(body))
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusBadRequest, r.Status, body)
		require.NotEmpty(t, r.Errors, body)
		require.NotEqual(t, "INTERNAL", r.Errors[0].code(), "%s: %s", body, r.Errors[0].Message)
	}
	// stopAll (cleanup) also fails the test on the logged "panic".
}
