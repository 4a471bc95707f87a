#!/usr/bin/env bash
# scripts/otelcol.sh builds the OpenTelemetry Collector of `make test-otel` and
# prints the absolute path of its binary on stdout (progress goes to stderr).
#
# The collector builder (ocb) at OCB_VERSION and every module of the manifest
# (scripts/otelcol-builder.yaml) come from the Go module proxy through the go
# command: nothing else is downloaded or installed. The build goes to
# .cache/otelcol/<key>/, where key hashes the manifest, OCB_VERSION and the Go
# version; a binary already built for the same key is reused at once, and the
# builds of other keys are removed after a new one succeeds.
#
# Exit status 1, with the reason on stderr, when the collector cannot be built
# (no Go, the module proxy unreachable, a version it does not serve).
set -euo pipefail

# The builder's release; keep it at the manifest's collector release.
OCB_VERSION=${OCB_VERSION:-v0.165.0}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
manifest=$root/scripts/otelcol-builder.yaml
cache=$root/.cache/otelcol

die() {
	echo "otelcol.sh: $*" >&2
	exit 1
}

command -v go >/dev/null || die "no go command on PATH"
go_version=$(go env GOVERSION) || die "go env GOVERSION failed"
key=$({ cat "$manifest"; echo "$OCB_VERSION $go_version"; } | sha256sum | cut -c1-16)
# The builder writes the binary, named after dist.name, into dist.output_path.
bin=$cache/$key/src/otelcol-causet
if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$cache"
start=$(date +%s)
builder=$cache/ocb-$OCB_VERSION/builder
if [[ ! -x $builder ]]; then
	echo "otelcol.sh: installing the collector builder $OCB_VERSION" >&2
	GOBIN=$cache/ocb-$OCB_VERSION go install "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION" >&2 ||
		die "go install go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION failed"
fi

# Build in a folder of its own and move it into place only when complete, so
# that an interrupted or concurrent build never leaves a half-built key.
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "otelcol.sh: building the collector of $manifest in $cache/$key (a few minutes the first time)" >&2
# The generated module lies inside this repository's work tree: no VCS stamp.
(cd "$work" && GOFLAGS="${GOFLAGS:-} -buildvcs=false" "$builder" --config "$manifest") >&2 ||
	die "the collector builder failed on $manifest (its output is above)"
[[ -x $work/src/otelcol-causet ]] || die "the builder reported success but wrote no $work/src/otelcol-causet"

if mv -T "$work" "$cache/$key" 2>/dev/null; then
	for old in "$cache"/*/src; do
		old=${old%/src}
		[[ $old == "$cache/$key" || $old == "$cache"/build.* ]] || rm -rf "$old"
	done
fi
echo "otelcol.sh: built $bin in $(($(date +%s) - start))s" >&2
echo "$bin"
