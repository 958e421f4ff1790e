// Package e2e drives the whole of Dropline the way its users do: the real App
// (or the real binary) on a free port, real Redis, real Postgres, GraphQL over
// HTTP. It has tests only.
package e2e
