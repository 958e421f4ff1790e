package app

// DefaultDeps is the production wiring of the domain packages into the App:
// the one place cmd/ and e2e/ get db/, inventory/, resolvers/ and worker/
// from. See the package documentation for what each field should call.
//
// TODO(lead): wire the domain packages here once they build:
//
//	return Deps{
//		Migrate:           db.Migrate,
//		PendingMigrations: db.Pending,
//		Build:             buildServices, // inventory.NewEngine + resolvers.NewHandler + worker.NewGroup
//		SeedDemo:          seedDemo,      // engine.CreateProduct for the demo catalogue
//	}
func DefaultDeps() Deps {
	return Deps{}
}
