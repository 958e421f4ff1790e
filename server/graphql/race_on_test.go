//go:build race

package graphql_test

// raceEnabled scales load tests down: the race detector allows at most
// 8,128 live goroutines.
const raceEnabled = true
