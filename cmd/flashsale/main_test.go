package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	env := func(string) string { return "" }
	for name, args := range map[string][]string{
		"remote target":  {"--dev", "--no-ledger", "--url", "http://10.9.8.7:8080"},
		"no secret":      {"--no-ledger"},
		"bad ratio":      {"--dev", "--no-ledger", "--commit", "0.9", "--cancel", "0.2"},
		"unknown flag":   {"--frobnicate"},
		"queue of none":  {"--dev", "--no-ledger", "--url", "http://127.0.0.1:1", "--mode", "queue", "--queue-people", "0"},
		"stray argument": {"--dev", "now"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, env, &out, &errb)
		require.Equal(t, exitUsage, code, name)
		require.NotEmpty(t, errb.String(), name)
	}
	var out, errb bytes.Buffer
	require.Equal(t, exitOK, run(context.Background(), []string{"--help"}, env, &out, &errb))
	require.Contains(t, errb.String(), "-allow-remote")
}

func TestSecretFromEnvironment(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	env := func(k string) string {
		if k == "DROPLINE_JWT_SECRET" {
			return "0123456789abcdef0123456789abcdef"
		}
		return ""
	}
	// The secret is accepted, so the failure is the target being down.
	code := run(context.Background(), []string{"--no-ledger", "--quiet", "--url", "http://127.0.0.1:1", "--timeout", "1s"}, env, &out, &errb)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errb.String(), "TRANSPORT")
	require.NotContains(t, errb.String(), "JWT")
}
