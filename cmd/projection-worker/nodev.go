//go:build !dev

package main

import (
	"context"
	"io"

	"github.com/causet/projection-worker/internal/flagenv"
)

// runDev stands in for the dev command (dev.go), which is left out of a
// build without -tags dev so that the production binary links neither the
// embedded broker nor the throwaway PostgreSQL. It returns a usage error
// saying how to get it.
func runDev(context.Context, []string, io.Writer, io.Writer) error {
	return flagenv.Usagef("the dev command is not in this build: run `make run`, or build with `go build -tags dev ./cmd/projection-worker`")
}
