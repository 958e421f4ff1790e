// Package script is the engine's Redis-script layer: the key layout (Keys,
// the one place a key name is formatted) and one typed function per script
// of package lua, with its arguments and its reply as structs. An
// aggregate of the engine (holds, carts, waitlist, draws, drops, the
// admission queue) runs a script only through this package:
//
//	res, err := script.RunExtendHold(ctx, run, keys, script.ExtendHold{Partition: p, Token: tok, ...})
//	switch res.Code { ... res.Extensions ... }
//
// Each typed argument struct has a Call method that lays out the script's
// KEYS and ARGV in the order its header in lua/ gives (a Call can also be
// sent in a pipeline, as the sweeps do), and each reply shape has one
// decoder here (HoldOf for lib.lua's hold_reply, WaitOf for wait_reply,
// ...): positions are read in this package and nowhere else. Reply is the
// raw reply, shared by every caller. TestCallsMatchTheirHeaders checks each
// call against its script's header, and TestDerivedKeysAreDeclared follows
// each script's calls through lib.lua to the key helpers it reaches, so a
// key a script derives from the partition base is declared and its base is
// the partition of its KEYS.
//
// Why a package of its own, below the aggregates: every aggregate needs the
// keys and the scripts, and none may import another; a layer they all
// import, which imports none of them (only package lua, for the scripts'
// names, and nothing of Redis but through the Runner the engine hands in),
// keeps the arrows pointing one way: inventory and its aggregates ->
// script -> lua -> policy.
package script
