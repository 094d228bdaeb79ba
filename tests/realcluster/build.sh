#!/usr/bin/env bash
# Builds the real control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, KWOK), helm and promlint
# from the Go module proxy into a cache directory keyed by tests/realcluster/versions.env, and cluster-autoscaler into one keyed by
# its own version: from the module proxy when it serves it, else from the source tarball HOMELAB_CLUSTER_AUTOSCALER_SOURCE
# names (checked against versions.env's sha256). Idempotent, and safe to run twice at once (one flock per cache key).
# Prints the directory last.
#
#   tests/realcluster/build.sh                            build what is missing, print the bin directory
#   tests/realcluster/build.sh --where                    print the bin directory's parent only (nothing is built)
#   tests/realcluster/build.sh --where-cluster-autoscaler print cluster-autoscaler's directory only (nothing is built)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root=${HOMELAB_CLUSTER_BINS:-${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/cluster-bins}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
dir="$root/$key"
# cluster-autoscaler has a cache directory of its own: a new Kubernetes does not rebuild it, nor it Kubernetes.
ca_key="cluster-autoscaler-${CLUSTER_AUTOSCALER_RELEASE}_${CLUSTER_AUTOSCALER_VERSION}"
ca_dir="$root/$ca_key"
if [[ "${1:-}" == "--where" ]]; then
  echo "$dir"
  exit 0
fi
if [[ "${1:-}" == "--where-cluster-autoscaler" ]]; then
  echo "$ca_dir"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: no 'go' on PATH (Go >= 1.26 is needed)" >&2; exit 2; }
command -v flock >/dev/null || { echo "build.sh: no 'flock' on PATH (util-linux)" >&2; exit 2; }
mkdir -p "$root" "$dir/bin"
exec 9>"$root/.$key.lock"
if ! flock -n 9; then
  echo "build.sh: another build of $key is running; waiting for it (at most 90 min)" >&2
  flock -w 5400 9 || { echo "build.sh: gave up waiting for the lock on $root/.$key.lock" >&2; exit 1; }
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
work=$(mktemp -d "$root/.work-XXXXXX")
trap 'rm -rf "$work"' EXIT
summary=()

stamp() { date +%s; }
took() { echo $(( $(stamp) - $1 )); }

# One wrapper module per tool: requiring them side by side raises shared dependencies by minimum version
# selection and the Kubernetes packages stop compiling.
build_kubernetes() {
  local m="$work/kubernetes" staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
    cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
    kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
    sample-apiserver sample-cli-plugin sample-controller)
  mkdir -p "$m"
  {
    echo "module homelab-autoscaler.test/kubernetes-bins"
    echo
    echo "go 1.25.0"
    echo
    echo "godebug default=go1.25"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    for s in "${staging[@]}"; do echo "	k8s.io/$s => k8s.io/$s $STAGING_VERSION"; done
    echo ")"
  } >"$m/go.mod"
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  (cd "$m" && go mod download k8s.io/kubernetes &&
    go build -trimpath -ldflags "$ld" -o "$m/out/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl)
  # kubectl of the same release applies deploy/ as a user would (`apply --server-side -k`).
  mv -f "$m/out/kube-apiserver" "$m/out/kube-controller-manager" "$m/out/kube-scheduler" "$m/out/kubectl" "$dir/bin/"
}

build_etcd() {
  local m="$work/etcd"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/etcd-bins\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$ETCD_VERSION" >"$m/go.mod"
  (cd "$m" && go mod download go.etcd.io/etcd/server/v3 &&
    go build -trimpath -ldflags "-s -w" -o "$m/etcd" go.etcd.io/etcd/server/v3)
  mv -f "$m/etcd" "$dir/bin/etcd"
}

build_kwok() {
  local m="$work/kwok"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/kwok-bins\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok %s\n' \
    "$KWOK_VERSION" >"$m/go.mod"
  (cd "$m" && go mod download sigs.k8s.io/kwok &&
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
      -o "$m/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # The standalone binary has no default Stages: keep the upstream ones beside it, the harness picks from them.
  local src
  src=$(cd "$m" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$dir/kwok-stages"
  cp -r "$src/kustomize/stage" "$dir/kwok-stages"
  chmod -R u+w "$dir/kwok-stages"
  mv -f "$m/kwok" "$dir/bin/kwok"
}

# helm, for the chart in charts/: tests/test_chart.py renders it against deploy/, tests/realcluster/test_helm_real.py
# installs, upgrades and uninstalls it. The module path carries the major version (helm.sh/helm/v4). A stamp names
# the version built, so a new HELM_VERSION rebuilds helm alone, not the control plane beside it.
build_helm() {
  local m="$work/helm" module="helm.sh/helm/${HELM_VERSION%%.*}"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/helm-bins\n\ngo 1.26.0\n\nrequire %s %s\n' "$module" "$HELM_VERSION" >"$m/go.mod"
  (cd "$m" && go mod download "$module" &&
    go build -trimpath -ldflags "-s -w -X $module/internal/version.version=$HELM_VERSION \
      -X $module/internal/version.gitTreeState=clean" -o "$m/helm" "$module/cmd/helm")
  rm -f "$dir"/helm-*.built
  mv -f "$m/helm" "$dir/bin/helm"
  touch "$dir/helm-$HELM_VERSION.built"
}

# promlint (tests/realcluster/promlint): the lint `promtool check metrics` runs, client_golang's promlint, for the
# operator's /metrics (tests/test_metrics_lint.py). Built from client_golang's module alone in seconds: promtool
# itself compiled all of Prometheus and the ~1 GB of cloud SDKs its service discovery imports (270 s cold on 2 cores)
# for this one check. Like helm, a stamp names the version built.
build_promlint() {
  local m="$work/promlint" module="github.com/prometheus/client_golang"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/promlint\n\ngo 1.26.0\n\nrequire %s %s\n' "$module" \
    "$PROMETHEUS_CLIENT_GOLANG_VERSION" >"$m/go.mod"
  cp "$here/promlint/main.go" "$m/main.go"
  (cd "$m" && go mod download "$module" && go build -trimpath -ldflags "-s -w" -o "$m/promlint" .)
  rm -f "$dir"/promlint-*.built "$dir"/promtool-*.built "$dir/bin/promtool"
  mv -f "$m/promlint" "$dir/bin/promlint"
  touch "$dir/$promlint_stamp"
}
# The stamp names the module's version and the source's content: a change of either rebuilds it.
promlint_stamp="promlint-$PROMETHEUS_CLIENT_GOLANG_VERSION-$(sha256sum "$here/promlint/main.go" | cut -c1-12).built"

# KWOK's Logs CRD, beside its Stages: with `--enable-crds=Logs` a KWOK kubelet serves `kubectl logs` of a Pod from the
# file a Logs object names (the harness's power executor writes its Pods' output there, as a container runtime would).
copy_kwok_crds() {
  local m="$work/kwok-crds" src
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/kwok-crds\n\ngo 1.26.0\n' >"$m/go.mod"
  src=$(cd "$m" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$dir/kwok-crds.partial"
  mkdir -p "$dir/kwok-crds.partial"
  cp "$src/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml" "$dir/kwok-crds.partial/"
  chmod -R u+w "$dir/kwok-crds.partial"
  rm -rf "$dir/kwok-crds"
  mv "$dir/kwok-crds.partial" "$dir/kwok-crds"
}

# --- cluster-autoscaler -----------------------------------------------------------------------------------------
# In order: the Go module proxy; else the source tarball named by HOMELAB_CLUSTER_AUTOSCALER_SOURCE; else neither,
# and why is kept in "$ca_dir/unavailable" for the harness to print. "$ca_dir/built-from" says which path built the
# binary that is there (the story's first line names it).

# From the module proxy. Its go.mod replaces its apis module with ./apis, which a dependency loses: the wrapper pins
# the apis module to the same commit and repeats the rest of its replace block. No `go mod tidy`: tidy considers
# every build tag and would pull every cloud's SDK; `-tags externalgrpc` builds the one provider used.
# Returns 3 when the proxy refuses it, with the refusal in "$ca_dir/proxy-refused".
build_cluster_autoscaler_from_proxy() {
  local m="$work/ca" err line gomod
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/ca-bins\n\ngo 1.25.0\n' >"$m/go.mod"
  if ! err=$(cd "$m" && timeout 300 go mod download -json \
      "$CLUSTER_AUTOSCALER_MODULE@$CLUSTER_AUTOSCALER_VERSION" 2>&1); then
    # `go mod download -json` puts the refusal in an "Error" field; keep that line (the exact error), else all.
    line=$(printf '%s\n' "$err" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' | sed 's/\\n\\t/ /g; s/\\t/ /g')
    printf 'the Go module proxy refused it: %s\n' "${line:-$err}" >"$ca_dir/proxy-refused"
    return 3
  fi
  gomod=$(printf '%s\n' "$err" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  {
    echo "module homelab-autoscaler.test/ca-bins"
    echo
    echo "go 1.25.0"
    echo
    echo "godebug default=go1.25"
    echo
    echo "require ("
    echo "	$CLUSTER_AUTOSCALER_MODULE $CLUSTER_AUTOSCALER_VERSION"
    echo "	$CLUSTER_AUTOSCALER_MODULE/apis $CLUSTER_AUTOSCALER_VERSION"
    echo ")"
    echo
    # Every single-line replace of cluster-autoscaler's own go.mod, but the local ./apis one.
    grep -E '^replace [^ ]+ => [^ .][^ ]* v[^ ]+$' "$gomod" | grep -v '=> \./' || true
  } >"$m/go.mod"
  (cd "$m" && go build -trimpath -tags externalgrpc -ldflags "-s -w" -o "$m/cluster-autoscaler" \
    "$CLUSTER_AUTOSCALER_MODULE") || { echo "build.sh: cluster-autoscaler was served by the proxy but did not build" >&2
      return 1; }
  mv -f "$m/cluster-autoscaler" "$ca_dir/bin/cluster-autoscaler"
}

# From the source tarball: checked against versions.env's sha256 before anything is extracted, extracted into the
# scratch directory (the tarball's own directory may be read-only), and built from inside its top directory, where
# its go.mod is the main module and its replace block (the ./apis module) applies as written.
build_cluster_autoscaler_from_source() {
  local tarball=$1 sum src top module
  if [[ ! -f "$tarball" ]]; then
    echo "build.sh: HOMELAB_CLUSTER_AUTOSCALER_SOURCE=$tarball: no such file" >&2
    return 1
  fi
  sum=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [[ "$sum" != "$CLUSTER_AUTOSCALER_SOURCE_SHA256" ]]; then
    echo "build.sh: HOMELAB_CLUSTER_AUTOSCALER_SOURCE=$tarball has sha256 $sum, but tests/realcluster/versions.env" \
      "pins cluster-autoscaler $CLUSTER_AUTOSCALER_RELEASE's source at $CLUSTER_AUTOSCALER_SOURCE_SHA256: not built" >&2
    return 1
  fi
  src="$work/ca-src"
  mkdir -p "$src"
  tar -xzf "$tarball" -C "$src" --no-same-owner
  chmod -R u+w "$src"
  top=$(find "$src" -mindepth 1 -maxdepth 1 -type d)
  if [[ -z "$top" || "$top" == *$'\n'* || ! -f "$top/go.mod" ]]; then
    echo "build.sh: $tarball does not hold one top directory with a go.mod" >&2
    return 1
  fi
  module=$(sed -n 's/^module[[:space:]]*//p' "$top/go.mod")
  if [[ "$module" != "$CLUSTER_AUTOSCALER_MODULE" ]]; then
    echo "build.sh: $tarball's go.mod is module '$module', not $CLUSTER_AUTOSCALER_MODULE" >&2
    return 1
  fi
  (cd "$top" && go build -trimpath -tags externalgrpc -ldflags "-s -w" -o "$work/ca-out/cluster-autoscaler" .) || {
    echo "build.sh: cluster-autoscaler's source from $tarball did not build" >&2
    return 1
  }
  mv -f "$work/ca-out/cluster-autoscaler" "$ca_dir/bin/cluster-autoscaler"
}

# The path taken and its time, into the summary and "$ca_dir/built-from"; exits 1 when a path was tried and failed.
cluster_autoscaler() {
  local name="cluster-autoscaler $CLUSTER_AUTOSCALER_RELEASE" t0 rc=0 source=${HOMELAB_CLUSTER_AUTOSCALER_SOURCE:-}
  local refused how
  mkdir -p "$ca_dir/bin"
  exec 8>"$root/.$ca_key.lock"
  if ! flock -n 8; then
    echo "build.sh: another build of $ca_key is running; waiting for it (at most 30 min)" >&2
    flock -w 1800 8 || { echo "build.sh: gave up waiting for the lock on $root/.$ca_key.lock" >&2; exit 1; }
  fi
  if [[ -x "$ca_dir/bin/cluster-autoscaler" && -f "$ca_dir/built-from" ]]; then
    summary+=("$(printf '%-26s cached: %s' "$name" "$(cat "$ca_dir/built-from")")")
    return 0
  fi
  rm -f "$ca_dir/unavailable" "$ca_dir/built-from" "$ca_dir/proxy-refused" "$ca_dir/bin/cluster-autoscaler"
  echo "build.sh: building $name from the Go module proxy ..." >&2
  t0=$(stamp)
  build_cluster_autoscaler_from_proxy >&2 || rc=$?
  if [[ $rc -eq 0 ]]; then
    how="built from the Go module proxy ($CLUSTER_AUTOSCALER_MODULE@$CLUSTER_AUTOSCALER_VERSION) in $(took "$t0") s"
  elif [[ $rc -ne 3 ]]; then
    echo "build.sh: building $name failed (exit $rc)" >&2
    exit 1
  else
    refused=$(cat "$ca_dir/proxy-refused")
    if [[ -z "$source" ]]; then
      printf '%s; and HOMELAB_CLUSTER_AUTOSCALER_SOURCE names no source tarball\n' "$refused" >"$ca_dir/unavailable"
      summary+=("$(printf '%-26s unavailable: %s' "$name" "$(cat "$ca_dir/unavailable")")")
      return 0
    fi
    echo "build.sh: $refused" >&2
    echo "build.sh: building $name from the source tarball $source ..." >&2
    t0=$(stamp)
    build_cluster_autoscaler_from_source "$source" >&2 || {
      echo "build.sh: building $name from $source failed" >&2
      exit 1
    }
    how="built from the source tarball $source (sha256 $CLUSTER_AUTOSCALER_SOURCE_SHA256) in $(took "$t0") s, the"
    how+=" Go module proxy having refused it"
  fi
  echo "$how on $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$ca_dir/built-from"
  summary+=("$(printf '%-26s %s' "$name" "$how")")
}

run() {
  local name=$1 checks=$2 fn=$3 t0 rc=0 have=1 c
  for c in $checks; do
    [[ -e "$dir/$c" ]] || have=0
  done
  if [[ $have -eq 1 ]]; then
    summary+=("$(printf '%-26s cached' "$name")")
    return 0
  fi
  echo "build.sh: building $name ..." >&2
  t0=$(stamp)
  "$fn" >&2 || rc=$?
  if [[ $rc -eq 0 ]]; then
    summary+=("$(printf '%-26s built in %4d s' "$name" "$(took "$t0")")")
  else
    echo "build.sh: building $name failed (exit $rc)" >&2
    exit 1
  fi
}

t_all=$(stamp)
run "kubernetes $KUBERNETES_VERSION" "bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler bin/kubectl" build_kubernetes
run "etcd $ETCD_VERSION" bin/etcd build_etcd
run "kwok $KWOK_VERSION" "bin/kwok kwok-stages" build_kwok
run "kwok's Logs CRD" kwok-crds/kwok.x-k8s.io_logs.yaml copy_kwok_crds
run "helm $HELM_VERSION" "bin/helm helm-$HELM_VERSION.built" build_helm
run "promlint $PROMETHEUS_CLIENT_GOLANG_VERSION" "bin/promlint $promlint_stamp" build_promlint
cluster_autoscaler
{
  for line in "${summary[@]}"; do echo "build.sh: $line"; done
  echo "build.sh: $(took "$t_all") s in all, into $dir"
} >&2
echo "$dir/bin"
