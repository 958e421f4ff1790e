package graphql_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dropline/dropline/server/graphql"
)

// TestReserveVarsIsTheFirstMutator: the query cache hands a plain
// reserve's document to gqlgen without its variable's declaration, and
// the reserve variables extension puts the original back; every other
// operation context mutator (introspection, the subgraph, the limits, the
// cost, trusted documents or persisted queries, the gate) must come after
// it, or it would see the copy. Checked in the executor the handler
// builds, for each configuration that changes its extensions. With tracing
// on, the copies are off and so is the extension.
func TestReserveVarsIsTheFirstMutator(t *testing.T) {
	var base graphql.Config
	setup(t, func(c *graphql.Config) { base = *c })
	docs, err := graphql.ParseTrustedDocuments(apolloManifest(t, trustedReserve))
	require.NoError(t, err)
	const reserveVars = "*graphql.reserveVars"
	for _, tc := range []struct {
		name string
		mod  func(*graphql.Config)
	}{
		{"default", func(*graphql.Config) {}},
		{"dev", func(c *graphql.Config) { c.Dev = true }},
		{"trusted", func(c *graphql.Config) { c.TrustedDocuments = docs }},
		{"trusted dev", func(c *graphql.Config) { c.TrustedDocuments, c.Dev = docs, true }},
		{"cost budgets", func(c *graphql.Config) { c.Limits.CostRate = 100 }},
		{"tracing", func(c *graphql.Config) { c.Tracer = noop.NewTracerProvider() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Registerer = prometheus.NewRegistry()
			tc.mod(&cfg)
			ms, err := graphql.OperationContextMutators(cfg)
			require.NoError(t, err)
			t.Logf("operation context mutators: %v", ms)
			if cfg.Tracer != nil {
				require.NotContains(t, ms, reserveVars)
				return
			}
			require.Greater(t, len(ms), 1, "no other mutator to come after it")
			require.Equal(t, reserveVars, ms[0], "an operation context mutator runs before the reserve variables are put back")
			require.NotContains(t, ms[1:], reserveVars)
		})
	}
}
