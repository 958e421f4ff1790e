package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Check is one readiness condition, such as "Redis answers PING" or "no
// migrations are pending". Fn gets a context bounded by the check timeout
// and returns an error that explains the failure to an operator (in the
// log and on the admin listener's /readyz, never on the public port).
type Check struct {
	// Name is the key of the failure in the admin /readyz's "failed" object.
	Name string
	// Fn returns nil when the dependency is ready.
	Fn func(ctx context.Context) error
}

// readyBody is the JSON answer of /readyz. Failed is set on the admin
// listener only.
type readyBody struct {
	Status string            `json:"status"`
	Failed map[string]string `json:"failed,omitempty"`
}

// readyHandler runs all checks concurrently, each under timeout, on every
// request: readiness must recover by itself as soon as a dependency comes
// back, so nothing is cached.
//
// With details (the admin listener) the answer names each failure. Without
// (the public port) it says only whether the process is ready: a failure
// names internal hosts and ports ("dial tcp 10.0.3.7:6379: connection
// refused"), which are nobody's business on the internet, so they go to
// the log instead, on a warning "not ready" with the request's id.
func readyHandler(checks []Check, timeout time.Duration, details bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		failed := RunChecks(r.Context(), checks, timeout)
		if len(failed) == 0 {
			writeJSON(w, r, http.StatusOK, readyBody{Status: "ready"})
			return
		}
		body := readyBody{Status: "unavailable"}
		if details {
			body.Failed = failed
		} else {
			zerolog.Ctx(r.Context()).Warn().Interface("failed", failed).Msg("not ready")
		}
		writeJSON(w, r, http.StatusServiceUnavailable, body)
	})
}

// RunChecks runs checks concurrently, each under its own timeout, and
// returns the failures by name (empty when all passed). A check that
// panics or overruns its timeout counts as failed. The App uses it too, to
// report what is not ready at start.
func RunChecks(ctx context.Context, checks []Check, timeout time.Duration) map[string]string {
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed = map[string]string{}
	)
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runCheck(ctx, c, timeout); err != nil {
				mu.Lock()
				failed[c.Name] = err.Error()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

func runCheck(ctx context.Context, c Check, timeout time.Duration) (err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				result <- fmt.Errorf("check panicked: %v", v)
			}
		}()
		result <- c.Fn(ctx)
	}()
	select {
	case err = <-result:
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("timed out after %s: %w", timeout, err)
		}
		return err
	case <-ctx.Done():
		// The check ignores its context; do not let it hold /readyz hostage.
		return fmt.Errorf("timed out after %s", timeout)
	}
}
