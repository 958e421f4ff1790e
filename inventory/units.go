package inventory

// The engine is cut by what it sells. Engine itself keeps the holds
// (reserve, commit, cancel, extend, and reading them) and what every part
// shares (configuration, keys, scripts, the ledger, rebuilds, the mutation
// budget); each other aggregate is a type of its own over the same engine,
// reached through its accessor: e.Carts().ReserveCart(...),
// e.Catalog().Stock(...). Each aggregate's calls and scripts are in its own
// files (carts: cart*.go; waitlists: waitlist.go, walk.go; draws: draw*.go;
// drops: drop.go; the catalog: product.go, stock.go, status.go), and
// TestAggregatesStayApart checks that no aggregate's code calls another's
// exported methods: they meet only in the engine's shared parts, the sale
// policy and the script layer.

// Carts reserves, commits, cancels and extends carts: several SKUs held
// together or not at all (see Carts in doc.go).
type Carts struct{ e *Engine }

// Carts is the engine's carts.
func (e *Engine) Carts() Carts { return Carts{e: e} }

// Waitlists puts buyers in a SKU's waitlist and reads it (see Waitlist in
// doc.go); freed units reach waiters inside the scripts that free them.
type Waitlists struct{ e *Engine }

// Waitlists is the engine's waitlists.
func (e *Engine) Waitlists() Waitlists { return Waitlists{e: e} }

// Draws takes a draw's entries, runs it and reads its result (see Draws in
// doc.go).
type Draws struct{ e *Engine }

// Draws is the engine's draws.
func (e *Engine) Draws() Draws { return Draws{e: e} }

// Drops creates and reads drops: SKUs under one per-person limit and one
// sale window (see Drops in doc.go).
type Drops struct{ e *Engine }

// Drops is the engine's drops.
func (e *Engine) Drops() Drops { return Drops{e: e} }

// Catalog creates, changes and reads products and their stock.
type Catalog struct{ e *Engine }

// Catalog is the engine's products and their stock.
func (e *Engine) Catalog() Catalog { return Catalog{e: e} }
