//go:build !race

package inventory_test

// raceEnabled relaxes timing bounds: the race detector slows Go code down
// several times over.
const raceEnabled = false
