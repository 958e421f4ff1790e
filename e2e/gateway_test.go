package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

// Dropline as a subgraph of a supergraph: Apollo's gateway from npm
// (e2e/gateway/gateway.mjs, @apollo/gateway) composes the real binary,
// started with DROPLINE_SUBGRAPH, with a small Node subgraph that extends
// Product with reviews and refers to Reservation and Drop by their keys.
// Queries through the gateway join both; a reservation reached through the
// gateway is its holder's alone, as on Dropline's own endpoint; Dropline
// prices _entities by its representations and bounds them; subscriptions
// stay on Dropline's endpoint.
func TestSupergraphThroughApolloGateway(t *testing.T) {
	t.Parallel()
	node := requireNode(t)
	dir, err := filepath.Abs("gateway")
	require.NoError(t, err)
	installNodeDeps(t, dir)

	srv := startBinary(t, map[string]string{"DROPLINE_DEV": "1", "DROPLINE_SUBGRAPH": "1"})
	s := &system{URL: srv.URL, Issuer: devIssuer(t), Pool: srv.Pool}
	s.createProduct(t, "FED-SNEAKER", 5, 0)
	s.createProduct(t, "FED-TEE", 50, 0)
	admin := s.token(t, "ops", true)
	r := s.gql(t, http.DefaultClient, admin, `mutation { createDrop(input: {id: "FED-DROP", name: "Friday drop", maxPerUser: 2}) { userErrors { code } } }`, nil, nil)
	require.Empty(t, r.Errors)
	alice, bob := s.token(t, "alice", false), s.token(t, "bob", false)
	var reserved struct {
		Reserve struct {
			Reservation reservation `json:"reservation"`
		} `json:"reserve"`
	}
	s.gql(t, http.DefaultClient, alice, `mutation { reserve(input: {sku: "FED-SNEAKER", quantity: 1, idempotencyKey: "fed-1"}) { reservation { token status } } }`, nil, &reserved)
	hold := reserved.Reserve.Reservation.Token
	require.NotEmpty(t, hold)

	began := time.Now()
	gw := startGateway(t, node, dir, srv.URL+"/graphql")
	t.Logf("the gateway composed the supergraph in %s", time.Since(began).Round(time.Millisecond))

	// Dropline's own fields and the reviews subgraph's, joined both ways.
	var page struct {
		ReviewedSkus []string `json:"reviewedSkus"`
		ReviewPage   struct {
			Name  string `json:"name"`
			Stock struct {
				Available int `json:"available"`
			} `json:"stock"`
			Reviews []struct {
				Stars int `json:"stars"`
			} `json:"reviews"`
		} `json:"reviewPage"`
		Product struct {
			Name    string `json:"name"`
			Reviews []struct {
				Body string `json:"body"`
			} `json:"reviews"`
		} `json:"product"`
		FeaturedDrop struct {
			Name       string `json:"name"`
			MaxPerUser int    `json:"maxPerUser"`
		} `json:"featuredDrop"`
	}
	r = gw.gql(t, "", `{
		reviewedSkus
		reviewPage(sku: "FED-SNEAKER") { name stock { available } reviews { stars } }
		product(sku: "FED-TEE") { name reviews { body } }
		featuredDrop(dropId: "FED-DROP") { name maxPerUser }
	}`, &page)
	require.Empty(t, r.Errors)
	require.Equal(t, []string{"FED-SNEAKER", "FED-TEE"}, page.ReviewedSkus)
	require.Equal(t, "E2E FED-SNEAKER", page.ReviewPage.Name)
	require.Equal(t, 4, page.ReviewPage.Stock.Available, "live stock, from Dropline")
	require.Len(t, page.ReviewPage.Reviews, 2)
	require.Equal(t, "E2E FED-TEE", page.Product.Name)
	require.Equal(t, "Fine tee.", page.Product.Reviews[0].Body)
	require.Equal(t, "Friday drop", page.FeaturedDrop.Name)
	require.Equal(t, 2, page.FeaturedDrop.MaxPerUser)

	// A reservation reached through the gateway is its holder's alone.
	order := `query($t: ID!) { order(token: $t) { token status product { name reviews { stars } } } }`
	var mine struct {
		Order *struct {
			Status  string `json:"status"`
			Product struct {
				Reviews []struct{ Stars int } `json:"reviews"`
			} `json:"product"`
		} `json:"order"`
	}
	r = gw.gqlVars(t, alice, order, map[string]any{"t": hold}, &mine)
	require.Empty(t, r.Errors)
	require.NotNil(t, mine.Order)
	require.Equal(t, "HELD", mine.Order.Status)
	require.Len(t, mine.Order.Product.Reviews, 2)
	for _, who := range []string{bob, ""} {
		var theirs struct {
			Order *struct {
				Status *string `json:"status"`
			} `json:"order"`
		}
		r = gw.gqlVars(t, who, order, map[string]any{"t": hold}, &theirs)
		require.True(t, theirs.Order == nil || theirs.Order.Status == nil, "another caller reads nothing of alice's hold: %s", r.Data)
		require.NotContains(t, string(r.Data), "HELD")
	}

	// _entities on Dropline itself: priced by its representations, and
	// bounded.
	reps := func(n int) []map[string]any {
		out := make([]map[string]any, n)
		for i := range out {
			out[i] = map[string]any{"__typename": "Product", "sku": fmt.Sprintf("FED-%d", i)}
		}
		return out
	}
	entities := `query($r: [_Any!]!) { _entities(representations: $r) { ... on Product { sku name } } }`
	cost := func(n int) float64 {
		t.Helper()
		body, err := json.Marshal(map[string]any{"query": entities, "variables": map[string]any{"r": reps(n)}})
		require.NoError(t, err)
		resp, err := http.Post(srv.URL+"/graphql", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Errors     []struct{ Extensions map[string]any } `json:"errors"`
			Extensions struct {
				Cost struct {
					Requested float64 `json:"requestedQueryCost"`
				} `json:"cost"`
			} `json:"extensions"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		if len(out.Errors) > 0 {
			return -1
		}
		return out.Extensions.Cost.Requested
	}
	one, ten := cost(1), cost(10)
	require.Positive(t, one)
	require.Equal(t, 10*(one-1)+1, ten, "each representation is priced as its selection")
	require.Equal(t, float64(-1), cost(101), "at most 100 representations")

	// Subscriptions are Dropline's own: the gateway does not run them.
	r = gw.gql(t, "", `subscription { stockChanged(skus: ["FED-SNEAKER"]) { available } }`, nil)
	require.NotEmpty(t, r.Errors)
}

// gateway is the supergraph's endpoint that gateway.mjs serves.
type gateway struct{ url string }

// startGateway runs gateway.mjs against the Dropline at droplineURL and
// waits until it has composed the supergraph; it is stopped when the test
// ends.
func startGateway(t *testing.T, node, dir, droplineURL string) *gateway {
	t.Helper()
	cmd := exec.Command(node, filepath.Join(dir, "gateway.mjs"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DROPLINE_URL="+droplineURL, "APOLLO_TELEMETRY_DISABLED=1")
	var stderr testenv.LogBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if !strings.HasPrefix(sc.Text(), `{"gateway"`) {
				continue // Apollo Server's own notices
			}
			select {
			case line <- sc.Text():
			default:
			}
		}
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var ready struct{ Gateway string }
	select {
	case l := <-line:
		require.NoError(t, json.Unmarshal([]byte(l), &ready), l)
	case <-done:
		t.Fatalf("the gateway exited:\n%s", stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the gateway did not start:\n%s", stderr.String())
	}
	return &gateway{url: ready.Gateway}
}

func (g *gateway) gql(t *testing.T, token, query string, out any) gqlResponse {
	t.Helper()
	return g.gqlVars(t, token, query, nil, out)
}

func (g *gateway) gqlVars(t *testing.T, token, query string, vars map[string]any, out any) gqlResponse {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var r gqlResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	if out != nil && len(r.Data) > 0 && !strings.HasPrefix(string(r.Data), "null") {
		require.NoError(t, json.Unmarshal(r.Data, out), string(r.Data))
	}
	return r
}
