package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/config"
)

// repoFiles returns the repository's own text files (no dependencies, no
// generated bundles, no fuzz corpora), relative to its root.
func repoFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("../..", path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "dist", "testdata", "bin", ".services":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".lua", ".sql", ".yml", ".yaml", ".graphqls", ".mjs", ".jsx", ".js", ".sh", ".json":
		default:
			if d.Name() != "Makefile" && d.Name() != "Dockerfile" && rel != filepath.Join(".ci", "run") {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	require.NoError(t, err)
	return files
}

// TestDesignNamesRealTests keeps docs/design.md honest: every test function
// and test file it cites as evidence for a guarantee exists.
func TestDesignNamesRealTests(t *testing.T) {
	t.Parallel()
	files := repoFiles(t)
	design, ok := files["docs/design.md"]
	require.True(t, ok, "docs/design.md is the contract")
	for g := 1; g <= 14; g++ {
		require.Regexp(t, regexp.MustCompile(`(?m)^### G`+strconv.Itoa(g)+` `), design, "G%d keeps its number", g)
	}

	funcs := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Example)\w*)\(`)
	for path, src := range files {
		if strings.HasSuffix(path, "_test.go") {
			for _, m := range decl.FindAllStringSubmatch(src, -1) {
				funcs[m[1]] = true
			}
		}
	}
	cited := regexp.MustCompile("`((?:Test|Fuzz)\\w*)(\\*?)`|\\b(?:inventory|auth|resolvers|graphql)\\.(Fuzz\\w+)")
	for _, m := range cited.FindAllStringSubmatch(design, -1) {
		name, prefix := m[1]+m[3], m[2] == "*"
		found := funcs[name]
		for f := range funcs {
			found = found || prefix && strings.HasPrefix(f, name)
		}
		require.True(t, found, "docs/design.md cites %s, which no test declares", m[0])
	}
	for _, m := range regexp.MustCompile("`([a-z0-9_/]+_test\\.go)`").FindAllStringSubmatch(design, -1) {
		_, ok := files[m[1]]
		require.True(t, ok, "docs/design.md cites %s, which does not exist", m[1])
	}
}

// TestRepositorySpeaksForItself: the code and docs cite the contract in
// docs/design.md, not documents or trackers outside the repository.
func TestRepositorySpeaksForItself(t *testing.T) {
	t.Parallel()
	outside := regexp.MustCompile(`\b(?:` + "DESIGN" + `|` + "STYLE" + `)\.md\b|(?i)\bissue #?[0-9]+\b`)
	for path, src := range repoFiles(t) {
		for i, line := range strings.Split(src, "\n") {
			require.False(t, outside.MatchString(line), "%s:%d cites something outside the repository: %s", path, i+1, strings.TrimSpace(line))
		}
	}
}

// TestReadmeGuaranteesFollowTheDesign keeps the README's numbered list of
// guarantees in step with docs/design.md: item n of the list is Gn, so its
// title shares a word (its first five letters) with the heading of Gn.
func TestReadmeGuaranteesFollowTheDesign(t *testing.T) {
	t.Parallel()
	files := repoFiles(t)
	headings := map[int]string{}
	for _, m := range regexp.MustCompile(`(?m)^### G(\d+) — (.+)$`).FindAllStringSubmatch(files["docs/design.md"], -1) {
		n, _ := strconv.Atoi(m[1])
		headings[n] = m[2]
	}
	require.Len(t, headings, 15, "docs/design.md numbers G1–G15")

	readme := files["README.md"]
	start := strings.Index(readme, "\n## Guarantees\n")
	require.GreaterOrEqual(t, start, 0, "the README lists the guarantees")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	items := regexp.MustCompile(`(?m)^(\d+)\. \*\*([^*]+)\*\*`).FindAllStringSubmatch(section, -1)
	require.Len(t, items, len(headings), "the README lists every guarantee once")

	stems := func(s string) map[string]bool {
		out := map[string]bool{}
		for _, w := range regexp.MustCompile(`[A-Za-z]+`).FindAllString(strings.ToLower(s), -1) {
			if len(w) >= 5 {
				out[w[:5]] = true
			}
		}
		return out
	}
	for i, m := range items {
		n, _ := strconv.Atoi(m[1])
		require.Equal(t, i+1, n, "the README numbers its guarantees in order")
		shared := false
		for s := range stems(m[2]) {
			shared = shared || stems(headings[n])[s]
		}
		require.True(t, shared, "README guarantee %d (%q) is not G%d of docs/design.md (%q)", n, m[2], n, headings[n])
	}
}

// TestReadmeConfigurationTable keeps the README's configuration table in
// step with the code: it names every variable config reads (and GOGC, which
// serve reads) and no other, and each default it gives in backquotes is the
// default, since loading that value changes nothing.
func TestReadmeConfigurationTable(t *testing.T) {
	t.Parallel()
	files := repoFiles(t)
	readme := files["README.md"]
	start := strings.Index(readme, "\n## Configuration\n")
	require.GreaterOrEqual(t, start, 0, "the README has a configuration table")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}

	read := map[string]bool{"GOGC": true}
	for _, m := range regexp.MustCompile(`(?m)^\s*Env\w+\s*=\s*"([A-Z_]+)"`).FindAllStringSubmatch(files["config/config.go"], -1) {
		read[m[1]] = true
	}
	require.Greater(t, len(read), 30, "config/config.go names its variables as Env constants")

	quoted := regexp.MustCompile("`([^`]*)`")
	listed := map[string]bool{}
	checked := 0
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 4 {
			continue
		}
		names := strings.Split(cells[1], " / ")
		defaults := strings.Split(cells[2], " / ")
		for i, cell := range names {
			name := strings.Trim(strings.TrimSpace(cell), "`")
			require.True(t, read[name], "the README's configuration table lists %s, which the code does not read", name)
			require.False(t, listed[name], "the README's configuration table lists %s twice", name)
			listed[name] = true
			if name == "GOGC" || len(defaults) != len(names) {
				continue
			}
			m := quoted.FindStringSubmatch(defaults[i])
			if m == nil {
				continue // (none), off, ...: nothing to load
			}
			c, err := config.Load(func(v string) string {
				if v == name {
					return m[1]
				}
				return ""
			})
			require.NoError(t, err, "the README's default of %s, %q, does not load", name, m[1])
			require.Equal(t, config.Default(), c, "the README's default of %s, %q, is not the code's", name, m[1])
			checked++
		}
	}
	for name := range read {
		require.True(t, listed[name], "the code reads %s, which the README's configuration table does not list", name)
	}
	require.Greater(t, checked, 20, "the table gives most defaults in backquotes")
}

// TestUsageNamesEveryVariable: `dropline help` lists every variable config
// reads, but for the test-only ones a deployment must never set.
func TestUsageNamesEveryVariable(t *testing.T) {
	t.Parallel()
	src := repoFiles(t)["config/config.go"]
	names := regexp.MustCompile(`(?m)^\s*Env\w+\s*=\s*"([A-Z_]+)"`).FindAllStringSubmatch(src, -1)
	require.Greater(t, len(names), 30, "config/config.go names its variables as Env constants")
	for _, m := range names {
		if strings.HasPrefix(m[1], "DROPLINE_TEST_") {
			continue
		}
		require.Regexp(t, regexp.MustCompile(`(?m)^  `+m[1]+` `), usage, "dropline help does not list %s", m[1])
	}
}
