package inventory

// SetRebuildPublishedHook makes fn run after each rebuild of e publishes its
// SKU, before the rebuild's snapshot transaction ends: where a test makes
// that transaction fail.
func SetRebuildPublishedHook(e *Engine, fn func(sku string)) { e.rebuildPublished = fn }
