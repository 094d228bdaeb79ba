#!/usr/bin/env bash
# Builds the bundled Temporal's programs from the Go module proxy (`make temporal-bins`): temporal-server (its four
# services in one process) and temporal-sql-tool from go.temporal.io/server, the Web UI's server from
# github.com/temporalio/ui-server/v2 (its assets embedded), with its config template (the schemas are
# embedded in temporal-sql-tool: `--schema-name`). Into a cache directory keyed by their versions
# (tests/realcluster/versions.env), under a flock per key, like build.sh. Prints the directory last.
#
#   tests/realcluster/build-temporal.sh            build what is missing, print the directory
#   tests/realcluster/build-temporal.sh --where    print the directory only (nothing is built)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root=${HOMELAB_CLUSTER_BINS:-${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/cluster-bins}
key="temporal-${TEMPORAL_SERVER_VERSION}_ui-${TEMPORAL_UI_VERSION}"
dir="$root/$key"
if [[ "${1:-}" == "--where" ]]; then
  echo "$dir"
  exit 0
fi
# The Web UI image keeps the module's config/docker.yaml (a template of its environment) beside the binary.
ui_config() {
  local u src
  u=$(mktemp -d)
  printf 'module homelab-autoscaler.test/temporal-ui-config\n\ngo 1.25.0\n' >"$u/go.mod"
  src=$(cd "$u" && GOFLAGS=-mod=mod go mod download -json "github.com/temporalio/ui-server/v2@$TEMPORAL_UI_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$u"
  mkdir -p "$dir/ui-config"
  install -m 0644 "$src/config/docker.yaml" "$dir/ui-config/docker.yaml"
}
if [[ -x "$dir/bin/temporal-server" && -x "$dir/bin/temporal-sql-tool" && -x "$dir/bin/ui-server" ]]; then
  [[ -f "$dir/ui-config/docker.yaml" ]] || ui_config
  echo "$dir"
  exit 0
fi

command -v go >/dev/null || { echo "build-temporal.sh: no 'go' on PATH (Go >= 1.26 is needed)" >&2; exit 2; }
command -v flock >/dev/null || { echo "build-temporal.sh: no 'flock' on PATH (util-linux)" >&2; exit 2; }
mkdir -p "$root" "$dir/bin"
exec 9>"$root/.$key.lock"
if ! flock -n 9; then
  echo "build-temporal.sh: another build of $key is running; waiting for it (at most 30 min)" >&2
  flock -w 1800 9 || { echo "build-temporal.sh: gave up waiting for the lock on $root/.$key.lock" >&2; exit 1; }
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
work=$(mktemp -d "$root/.work-temporal-XXXXXX")
trap 'rm -rf "$work"' EXIT
began=$(date +%s)

# The server and its SQL tool: one module of our own requiring go.temporal.io/server (its go.mod's replaces are not
# inherited, so the build is the module as published, as `go install` builds it).
m="$work/server"
mkdir -p "$m"
printf 'module homelab-autoscaler.test/temporal-bins\n\ngo 1.25.0\n\nrequire go.temporal.io/server %s\n' \
  "$TEMPORAL_SERVER_VERSION" >"$m/go.mod"
(cd "$m" && go mod download go.temporal.io/server &&
  go build -trimpath -ldflags "-s -w" -o "$m/temporal-server" go.temporal.io/server/cmd/server &&
  go build -trimpath -ldflags "-s -w" -o "$m/temporal-sql-tool" go.temporal.io/server/cmd/tools/sql)
server_s=$(( $(date +%s) - began ))

u="$work/ui"
mkdir -p "$u"
printf 'module homelab-autoscaler.test/temporal-ui-bins\n\ngo 1.25.0\n\nrequire github.com/temporalio/ui-server/v2 %s\n' \
  "$TEMPORAL_UI_VERSION" >"$u/go.mod"
(cd "$u" && go mod download github.com/temporalio/ui-server/v2 &&
  go build -trimpath -ldflags "-s -w" -o "$u/ui-server" github.com/temporalio/ui-server/v2/cmd/server)
mv -f "$m/temporal-server" "$m/temporal-sql-tool" "$u/ui-server" "$dir/bin/"
ui_config
echo "build-temporal.sh: temporal-server and temporal-sql-tool $TEMPORAL_SERVER_VERSION in ${server_s} s," \
  "ui-server $TEMPORAL_UI_VERSION in $(( $(date +%s) - began - server_s )) s" >&2
echo "$dir"
