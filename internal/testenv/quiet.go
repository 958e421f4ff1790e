package testenv

import (
	"os"
	"testing"
)

// passEnv is the variable scripts/test.sh sets for each of its passes:
// "quiet" for the tests marked with Quiet, "loaded" for the rest of the
// suite, two packages at a time.
const passEnv = "DROPLINE_TEST_PASS"

// Quiet marks a test that holds a wall-clock bound (a delivery within
// 250 ms, a release within a second of its expiry): two cores shared with
// another package's race-enabled tests can miss such a bound, so `make test`
// runs the test in its quiet pass, with nothing beside it, and never in the
// loaded pass.
//
// scripts/test.sh finds these tests by this call, written as the statement
// `testenv.Quiet(t)` in the Test function itself (in its body or a subtest's
// closure): the mark is the list. A call the script cannot see there (from a
// helper, say) would leave the test in the loaded pass, so in that pass Quiet
// fails the test, saying so, instead of letting it be measured under load.
// Outside scripts/test.sh (a plain `go test`) it does nothing.
func Quiet(t testing.TB) {
	t.Helper()
	if os.Getenv(passEnv) == "loaded" {
		t.Fatalf("testenv: %s holds a wall-clock bound and ran in make test's loaded pass: "+
			"write `testenv.Quiet(t)` as a statement in the Test function itself, where scripts/test.sh finds it", t.Name())
	}
}
