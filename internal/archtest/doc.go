// Package archtest holds the tests that keep the code's shape: which
// package may import which (layers), how long a hand-written file may grow
// and how many exported methods a type may have. It has no code of its own.
package archtest
