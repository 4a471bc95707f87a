// Package buildinfo gives the build version the commands print and record.
package buildinfo

import "runtime/debug"

// Version returns set when it is not empty (each command's main.version,
// set with -ldflags "-X main.version=..." by make build and the Dockerfile),
// else the module version of the build (go install ...@v1.2.3), else "dev".
func Version(set string) string {
	if set != "" {
		return set
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
