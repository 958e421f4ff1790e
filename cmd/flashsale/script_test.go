package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

// TestScriptLeavesTheServedDatabaseAlone runs `make flashsale`'s script as a
// newcomer would, with DATABASE_URL naming a database that stands for the
// one `make run` serves (its demo product in place): the rehearsal passes,
// that database still holds its one product and nothing else, and the run's
// own database is gone afterwards.
func TestScriptLeavesTheServedDatabaseAlone(t *testing.T) {
	t.Parallel()
	served := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, served)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `INSERT INTO products (sku, name, price_amount, price_currency, total)
		VALUES ('DEMO-1', 'the demo shop''s product', 100, 'EUR', 5)`)
	require.NoError(t, err)

	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "flashsale.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+served,
		"REPORT="+filepath.Join(t.TempDir(), "report.html"),
		"FLASHSALE_ARGS=--buyers 80 --stock 10 --concurrency 8 --hold 5s --quiet",
	)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "scripts/flashsale.sh:\n%s", out)
	require.Contains(t, string(out), "VERDICT  PASS", "%s", out)

	var skus []string
	rows, err := pool.Query(ctx, `SELECT sku FROM products ORDER BY sku`)
	require.NoError(t, err)
	for rows.Next() {
		var sku string
		require.NoError(t, rows.Scan(&sku))
		skus = append(skus, sku)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"DEMO-1"}, skus, "the rehearsal's products reached the served database")

	own := served[strings.LastIndex(served, "/")+1:]
	own = own[:strings.IndexAny(own+"?", "?")] + "_flashsale"
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, own).Scan(&left))
	require.Zero(t, left, "the run's own database %s is still there", own)
}
