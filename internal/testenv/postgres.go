package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dropline/dropline/db"
)

// DefaultDatabaseURL is where tests look for PostgreSQL when DATABASE_URL is unset.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// adminURL returns a URL for the server's maintenance database, used to create
// and drop per-test databases.
func adminURL() string {
	raw := os.Getenv("DATABASE_URL")
	if raw == "" {
		raw = DefaultDatabaseURL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return DefaultDatabaseURL
	}
	u.Path = "/postgres"
	return u.String()
}

// DatabaseURL returns the URL of database name on the test server.
func DatabaseURL(name string) string {
	u, _ := url.Parse(adminURL())
	u.Path = "/" + name
	return u.String()
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ensureTemplate migrates one template database per test binary; every test
// database is then a cheap copy of it.
func ensureTemplate(ctx context.Context) (string, error) {
	templateOnce.Do(func() {
		migrations, err := db.Migrations()
		if err != nil {
			templateErr = err
			return
		}
		// The template name carries the schema version, so a binary with newer
		// migrations never reuses a template built by an older one.
		templateName = fmt.Sprintf("dropline_tmpl_v%d_%s", migrations[len(migrations)-1].Version, randomSuffix())
		admin, err := pgx.Connect(ctx, adminURL())
		if err != nil {
			templateErr = fmt.Errorf("PostgreSQL is not reachable at %s (run `make services`): %w", adminURL(), err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{templateName}.Sanitize()); err != nil {
			templateErr = fmt.Errorf("creating template database: %w", err)
			return
		}
		pool, err := pgxpool.New(ctx, DatabaseURL(templateName))
		if err != nil {
			templateErr = err
			return
		}
		defer pool.Close()
		if err := db.Migrate(ctx, pool); err != nil {
			templateErr = err
		}
	})
	return templateName, templateErr
}

// NewDatabase creates an empty, fully migrated database for this test and
// returns its URL. The database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	url, drop, err := CreateDatabase()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(drop)
	return url
}

// CreateDatabase is NewDatabase for code without a testing.TB (examples,
// TestMain): it returns the URL and a function that drops the database.
func CreateDatabase() (url string, drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tmpl, err := ensureTemplate(ctx)
	if err != nil {
		return "", nil, err
	}
	name := "dropline_test_" + randomSuffix()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		return "", nil, fmt.Errorf("PostgreSQL is not reachable at %s (run `make services`): %w", adminURL(), err)
	}
	defer admin.Close(ctx)
	// CREATE DATABASE ... TEMPLATE fails while another session copies the same
	// template, so concurrent tests retry briefly.
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
			pgx.Identifier{name}.Sanitize(), pgx.Identifier{tmpl}.Sanitize()))
		if err == nil || attempt > 50 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	return DatabaseURL(name), func() { dropDatabase(name) }, nil
}

// NewUnmigratedDatabase creates an empty database without Dropline's schema,
// as an operator's is before `dropline migrate`, and returns its URL. It is
// dropped when the test ends.
func NewUnmigratedDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		t.Fatalf("testenv: PostgreSQL is not reachable at %s (run `make services`): %v", adminURL(), err)
	}
	defer admin.Close(ctx)
	name := "dropline_test_" + randomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: creating database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(name) })
	return DatabaseURL(name)
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Postgres returns a pool on a fresh, migrated database of this test's own.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(NewDatabase(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// DropTemplates removes the template database this binary created. Call it
// from TestMain after m.Run.
func DropTemplates() {
	if templateName == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{templateName}.Sanitize()+" WITH (FORCE)")
}
