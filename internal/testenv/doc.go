// Package testenv gives each test its own real PostgreSQL database and its own
// Redis key prefix, and can start a throwaway Redis Cluster, so tests run in
// parallel against real services without sharing state.
//
// Services are found through DATABASE_URL and REDIS_URL (the same variables
// the server reads; defaults match `make services`). A missing service fails the
// test loudly: a skipped test proves nothing in CI.
package testenv
