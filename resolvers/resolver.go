package resolvers

// Resolver is the root of the generated resolver tree. It holds only
// injected dependencies; per-request state (dataloaders) lives in the
// request context.
type Resolver struct {
	deps *deps
}
