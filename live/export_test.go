package live

// InitTestSignals makes the hub signal the test; call it before Start.
func (h *Hub) InitTestSignals() {
	h.confirmed.Init()
	h.dropped.Init()
}

// Confirmed delivers each SKU whose Redis subscription Redis confirmed.
func (h *Hub) Confirmed() <-chan string { return h.confirmed.C() }

// Dropped delivers once per stalled subscriber the hub dropped.
func (h *Hub) Dropped() <-chan struct{} { return h.dropped.C() }
