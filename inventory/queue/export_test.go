package queue

// JoinBatchStats are the batches of join_queue.lua s ran and the joins they
// carried.
func (s *Service) JoinBatchStats() (batches, joins int64) {
	return s.joins.batches.Load(), s.joins.joins.Load()
}
