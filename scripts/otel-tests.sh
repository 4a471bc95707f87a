#!/usr/bin/env bash
# scripts/otel-tests.sh FILE... prints a `go test -run` pattern, ^(TestA|TestB)$,
# naming the tests of the Go files given that use the OTLP test receiver: the
# Test functions that call newOTLPReceiver, directly or through other
# functions of those files (a helper that calls it, a helper of that helper).
# `make test-otel` runs these behind a real collector; a new test that uses
# the receiver is picked up without a list to keep.
#
# Exit status 1 when no test uses it (the pattern would run nothing).
set -euo pipefail
(($# > 0)) || { echo "usage: $0 FILE..." >&2; exit 2; }

tests=$(awk '
/^func / {
	name = $0
	sub(/^func (\([^)]*\) )?/, "", name) # a method: drop its receiver
	sub(/[[(].*/, "", name)
	rest = $0 # after the name: the calls of a body on this line
	sub(/^func (\([^)]*\) )?[A-Za-z0-9_]+/, "", rest)
	body[name] = "\n" rest
	next
}
name != "" { body[name] = body[name] "\n" $0 }
END {
	uses["newOTLPReceiver"] = 1
	for (changed = 1; changed; ) {
		changed = 0
		for (f in body) {
			if (f in uses) continue
			for (u in uses) {
				if (body[f] ~ ("[^A-Za-z0-9_]" u "\\(")) { uses[f] = 1; changed = 1; break }
			}
		}
	}
	for (f in uses) if (f ~ /^Test/) print f
}' "$@" | sort | paste -sd'|')
[[ -n $tests ]] || { echo "otel-tests.sh: no test in $* calls newOTLPReceiver" >&2; exit 1; }
echo "^($tests)\$"
