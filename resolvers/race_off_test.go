//go:build !race

package resolvers_test

// raceEnabled scales load tests down: the race detector allows at most
// 8,128 live goroutines.
const raceEnabled = false
