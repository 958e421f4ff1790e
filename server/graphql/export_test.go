package graphql

import "net/http"

// NewHandlerUnshared is NewHandler executing every subscription on its own,
// as gqlgen alone would, to compare against the shared execution.
func NewHandlerUnshared(cfg Config) http.Handler { return newHandler(cfg, false) }
