// Package queue is the admission queue in front of a product or a drop: a
// sale policy (policy.Queue), not a new path. On a queued product a reserve,
// a cart line or a waitlist join is refused without a valid admission pass
// (QUEUE_REQUIRED, PASS_EXPIRED, PASS_INVALID): lib.lua's may_take checks the
// pass in the same place as every other limit, and the hold (or the join)
// spends it. This package hands the passes out.
//
// # Shape
//
// A queue is created with its product (inventory.ProductInput.Queue) or its
// drop (inventory.DropInput.Queue); the ledger keeps its settings (queues)
// and a 32-byte seed whose SHA-256 is public from creation.
//
//		created ──► PRE_QUEUE ──opensAt──► numbering ──► OPEN ◄──► PAUSED
//		                                                   │  ◄──► SOLD_OUT
//		                                                   └──sale ends──► CLOSED
//
//	  - Before opensAt a join enters the pre-queue, without a number.
//	  - At opensAt the first script that runs (a join or a step) closes the
//	    pre-queue (queue_close in lib.lua); Step reads its members, sorts
//	    them, shuffles them with the draw's shuffle from the revealed seed
//	    (PreQueueOrder: anyone can recompute it) and writes their numbers
//	    1..n in batches of StepMost (number_queue.lua). Joins after the
//	    closing take n+1, n+2, ...: first come, first served.
//	  - Each Step (the worker group's admission ticker, once across instances
//	    by lease) admits the next numbers: at most the rate's credit, and never
//	    so many that passes neither spent nor expired outnumber the units
//	    available (admit_queue.lua). PAUSED while every unit is held, SOLD_OUT
//	    once every unit is sold, OPEN again when units come back.
//	  - An admitted principal's pass is bound to it and to the queue, lives
//	    passSeconds, and is spent by the hold or join it buys (spend_pass).
//
// # Keys
//
// Every key of a queue lives in its product's (or drop's) partition, so each
// script runs in one Redis Cluster slot with the stock it reads (see keys in
// keys.go): the queue's hash, the pre-queue set, principal→number and
// number→principal hashes, the passes and the unspent passes by expiry. A
// waiting ticket is two hash fields; a position is number − admittedThrough.
//
// # Bots
//
// A queue may ask each join for a hashcash proof (Challenge: signed with the
// service's secret, bound to principal and queue, short-lived, verified
// without state) and for a presale access code (each used by one principal,
// claimed in the ledger). One ticket per principal: joining again returns it.
//
// # Failure modes
//
// A crash mid-numbering is finished by the next Step (each number is written
// once; the order is deterministic). A duplicate Step (two instances during a
// lease handover) admits nothing the rate and the stock do not allow.
//
// # Ledger and Redis loss
//
// Every join (qjoin), the opening's closing (qclose) and numbering (qnum),
// each admission step (qadmit: its numbers, its nonce, from which each pass
// is recomputed, and the passes' expiry) and each spent pass (qspend, with
// what it bought) is appended to the partition's outbox by the script that
// does it, and reaches PostgreSQL by the write-behind, like a hold
// (queue_tickets, queue_movements, queues.admitted_through). A queue Redis
// lost is restored from those rows (Restore) by the first join, step or
// ticket read that finds it missing, and by the engine's rebuild of a queued
// SKU before the SKU goes live. What had not reached the ledger is lost with
// Redis, as holds are.
//
// A cart's line spends its pass provisionally (hold_cart_lines.lua): if the
// cart fails in another partition the line is released and the pass given
// back (return_pass in lib.lua); if the cart holds, the spending is recorded
// with the confirmed line.
package queue
