#!/usr/bin/env bash
# Builds the real node's programs from the Go module proxy (`make node-bins`): kubelet and kube-proxy from the
# k8s.io/kubernetes release of the control plane, CoreDNS with the plugins a cluster.local-only server needs,
# local-path-provisioner, kube-network-policies (the node's NetworkPolicy engine) and cert-manager's CRDs. Into a
# cache directory keyed by their versions
# (tests/realcluster/versions.env), under a flock per key, like build.sh. Prints the bin directory last.
#
#   tests/realcluster/build-node.sh            build what is missing, print the bin directory
#   tests/realcluster/build-node.sh --where    print the bin directory only (nothing is built)
#   tests/realcluster/build-node.sh --where-cert-manager-crds    the CRDs' file (nothing is fetched)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root=${HOMELAB_CLUSTER_BINS:-${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/cluster-bins}
key="node-k8s-${KUBERNETES_VERSION}_coredns-${COREDNS_VERSION}_lpp-${LOCAL_PATH_PROVISIONER_VERSION}"
# The engine's edits below are part of what is built: their revision is in the key, so a change rebuilds it.
KNP_EDITS=2
key+="_knp-${KUBE_NETWORK_POLICIES_VERSION}-e${KNP_EDITS}"
dir="$root/$key"
if [[ "${1:-}" == "--where" ]]; then
  echo "$dir/bin"
  exit 0
fi
if [[ "${1:-}" == "--where-cert-manager-crds" ]]; then
  echo "$dir/cert-manager-$CERT_MANAGER_VERSION-crds.yaml"
  exit 0
fi

command -v go >/dev/null || { echo "build-node.sh: no 'go' on PATH (Go >= 1.26 is needed)" >&2; exit 2; }
command -v flock >/dev/null || { echo "build-node.sh: no 'flock' on PATH (util-linux)" >&2; exit 2; }
mkdir -p "$root" "$dir/bin"
exec 9>"$root/.$key.lock"
if ! flock -n 9; then
  echo "build-node.sh: another build of $key is running; waiting for it (at most 90 min)" >&2
  flock -w 5400 9 || { echo "build-node.sh: gave up waiting for the lock on $root/.$key.lock" >&2; exit 1; }
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
work=$(mktemp -d "$root/.work-node-XXXXXX")
trap 'rm -rf "$work"' EXIT
summary=()
stamp() { date +%s; }

# kubelet and kube-proxy: a wrapper requiring k8s.io/kubernetes, each staging module its own go.mod points at
# ./staging replaced by the published module of the same release (read from that go.mod, so a release that adds
# one needs no edit here).
build_kubelet() {
  local m="$work/kubelet" gomod
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/node-bins\n\ngo 1.25.0\n' >"$m/go.mod"
  gomod=$(cd "$m" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  {
    printf 'module homelab-autoscaler.test/node-bins\n\ngo 1.25.0\n\ngodebug default=go1.25\n\n'
    printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$KUBERNETES_VERSION"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#	\1 => \1 '"$STAGING_VERSION"'#p' "$gomod"
    printf ')\n'
  } >"$m/go.mod"
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$now"
  done
  (cd "$m" && go build -trimpath -ldflags "$ld" -o "$m/out/" k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy)
  mv -f "$m/out/kubelet" "$m/out/kube-proxy" "$dir/bin/"
}

# CoreDNS with only the plugins the node's Corefile uses (serving cluster.local from the API; no forward plugin is
# even compiled in, so nothing can be forwarded off the machine): CoreDNS's own main, a shorter plugin list.
build_coredns() {
  local m="$work/coredns" p
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/coredns-bins\n\ngo 1.25.0\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" >"$m/go.mod"
  {
    printf '// CoreDNS with the plugins of a cluster.local-only server.\npackage main\n\nimport (\n'
    for p in cache errors health kubernetes loadbalance log loop ready reload; do
      printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"
    done
    printf '\t"github.com/coredns/coredns/coremain"\n)\n\nfunc main() { coremain.Run() }\n'
  } >"$m/main.go"
  (cd "$m" && go mod download github.com/coredns/coredns &&
    go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$m/coredns" .)
  mv -f "$m/coredns" "$dir/bin/coredns"
}

build_local_path_provisioner() {
  local m="$work/lpp"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/lpp-bins\n\ngo 1.25.0\n\nrequire github.com/rancher/local-path-provisioner %s\n' \
    "$LOCAL_PATH_PROVISIONER_VERSION" >"$m/go.mod"
  (cd "$m" && go mod download github.com/rancher/local-path-provisioner &&
    go build -trimpath -ldflags "-s -w" -o "$m/local-path-provisioner" github.com/rancher/local-path-provisioner)
  mv -f "$m/local-path-provisioner" "$dir/bin/local-path-provisioner"
  # Its install manifest, as its README has a user apply it; the harness renames the images in it.
  local src
  src=$(cd "$m" && go mod download -json "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  install -m 0644 "$src/deploy/local-path-storage.yaml" "$dir/local-path-storage.yaml"
}

# The Pod sandbox's process (what registry.k8s.io/pause runs): it holds the Pod's namespaces, reaps orphans, and
# exits on SIGTERM or SIGINT. No image can be pulled here, so it is built like everything else.
build_pause() {
  local m="$work/pause"
  mkdir -p "$m"
  printf 'module homelab-autoscaler.test/pause\n\ngo 1.25.0\n' >"$m/go.mod"
  cat >"$m/main.go" <<'GO'
// The Pod sandbox: sleeps, reaps orphans, exits on SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
GO
  (cd "$m" && go build -trimpath -ldflags "-s -w" -o "$m/pause" .)
  mv -f "$m/pause" "$dir/bin/pause"
}

# A module's source directory in the module cache (downloaded when missing): `module_source <path>@<version>`.
module_source() {
  local m
  m=$(mktemp -d "$work/source-XXXXXX")
  printf 'module homelab-autoscaler.test/source\n\ngo 1.25.0\n' >"$m/go.mod"
  (cd "$m" && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# kube-network-policies, SIG Network's NetworkPolicy engine (what kind runs): its own cmd/ built from its module's
# source as the main module, so its go.sum pins every dependency. Two edits, each checked to apply exactly once, so a
# release that moves the code fails here instead of building something else (a third, below, for its NRI fallback):
# - its main reads only the in-cluster config (a Pod's ServiceAccount files); a --kubeconfig flag is added, the
#   node's process has a kubeconfig of its own. And it never passes its own --disable-nri to the controller (v0.8.0);
#   it does now (the node's containerd 1.6 has no NRI; without it the engine would dial the machine's
#   /var/run/nri/nri.sock).
# - the queue verdict: these machines' kernels have no nft_queue (CONFIG_NFT_QUEUE unset: `nft add rule ... queue`
#   says "No such file or directory") but nft_compat and xt_NFQUEUE, so the same verdict is written as xtables'
#   NFQUEUE target (revision 3: the queue number, the bypass flag), the expression iptables-nft writes for
#   `-j NFQUEUE`. The packets reach the same queue and the engine's own verdict code.
build_kube_network_policies() {
  local m="$work/knp" src n
  mkdir -p "$m"
  src=$(module_source "sigs.k8s.io/kube-network-policies@$KUBE_NETWORK_POLICIES_VERSION")
  [[ -f "$src/cmd/main.go" ]] || { echo "build-node.sh: no cmd/main.go in $src" >&2; return 1; }
  cp -r "$src" "$m/src"
  chmod -R u+w "$m/src"
  n=$(grep -c 'rest\.InClusterConfig()' "$m/src/cmd/main.go" || true)
  [[ $n -eq 1 ]] || { echo "build-node.sh: kube-network-policies' main: $n InClusterConfig calls, 1 expected" >&2; return 1; }
  sed -i 's/rest\.InClusterConfig()/restConfig(rest.InClusterConfig)/' "$m/src/cmd/main.go"
  n=$(grep -c '^[[:space:]]*NetfilterBug1766Fix:[[:space:]]*netfilterBug1766Fix,$' "$m/src/cmd/main.go" || true)
  [[ $n -eq 1 ]] || { echo "build-node.sh: kube-network-policies' main: its Config literal moved" >&2; return 1; }
  sed -i 's/^\([[:space:]]*\)NetfilterBug1766Fix:[[:space:]]*netfilterBug1766Fix,$/&\n\1NRIdisabled: disableNRI,/' \
    "$m/src/cmd/main.go"
  cat >"$m/src/cmd/kubeconfig.go" <<'GO'
package main

// Added by homelab-autoscaler's tests/realcluster/build-node.sh: a kubeconfig for a process outside a Pod.

import (
	"flag"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var kubeconfig string

func init() {
	flag.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig; the in-cluster configuration when empty")
}

func restConfig(inCluster func() (*rest.Config, error)) (*rest.Config, error) {
	if kubeconfig == "" {
		return inCluster()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
GO
  local ctl="$m/src/pkg/networkpolicy/controller.go"
  n=$(grep -c '^[[:space:]]*queue,$' "$ctl" || true)
  [[ $n -ge 1 ]] && grep -q 'queue := &expr.Queue{Num: uint16(c.config.QueueID)}' "$ctl" ||
    { echo "build-node.sh: kube-network-policies' queue rules moved (controller.go)" >&2; return 1; }
  sed -i 's/^\([[:space:]]*\)queue,$/\1xtQueue(queue),/' "$ctl"
  cat >"$m/src/pkg/networkpolicy/xtqueue.go" <<'GO'
package networkpolicy

// Added by homelab-autoscaler's tests/realcluster/build-node.sh, for kernels without nft_queue.

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// xtQueue is the verdict q as xtables' NFQUEUE target, revision 3, through nft_compat.
func xtQueue(q *expr.Queue) expr.Any {
	// struct xt_NFQ_info_v3 { __u16 queuenum; __u16 queues_total; __u16 flags; }, padded to XT_ALIGN: 8 bytes.
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:], q.Num)
	binary.NativeEndian.PutUint16(info[2:], 1)
	var flags uint16
	if q.Flag&expr.QueueFlagBypass != 0 {
		flags |= 0x01 // NFQ_FLAG_BYPASS
	}
	binary.NativeEndian.PutUint16(info[4:], flags)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}
GO
  # With NRI off its pod lookup by IP still falls back to the NRI plugin, which is then nil: a packet from or to an
  # address no Pod holds any more (a Pod just deleted) panicked the engine, and with it every selected Pod's traffic
  # stopped (make e2e-pods' Temporal server deleted mid-boot found it). The fallback is skipped when there is none.
  n=$(grep -c '^[[:space:]]*podKey := c\.nriPlugin\.GetPodFromIP(podIP)$' "$m/src/pkg/networkpolicy/controller.go" || true)
  [[ $n -eq 1 ]] || { echo "build-node.sh: kube-network-policies' NRI fallback moved (controller.go)" >&2; return 1; }
  sed -i 's/^\([[:space:]]*\)podKey := c\.nriPlugin\.GetPodFromIP(podIP)$/\1if c.nriPlugin == nil {\n\1\treturn nil\n\1}\n&/' \
    "$m/src/pkg/networkpolicy/controller.go"
  (cd "$m/src" && go build -trimpath -ldflags "-s -w" -o "$m/kube-network-policies" ./cmd)
  mv -f "$m/kube-network-policies" "$dir/bin/kube-network-policies"
}

# cert-manager's CRDs, from its Go module's source (nothing is built): the mTLS overlay's Issuers and Certificates are
# then checked against cert-manager's own schema. The harness issues what its controller would (tests/realcluster/
# certmanager.py); building the controller itself is left out (docs/decisions.md).
fetch_cert_manager_crds() {
  local m="$work/cert-manager" src f
  mkdir -p "$m"
  src=$(module_source "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
  for f in "$src"/deploy/crds/cert-manager.io_*.yaml; do
    cat "$f"
  done >"$m/crds.yaml"
  install -m 0644 "$m/crds.yaml" "$dir/cert-manager-$CERT_MANAGER_VERSION-crds.yaml"
}

run() {
  local name=$1 checks=$2 fn=$3 t0 have=1 c
  for c in $checks; do
    [[ -e "$dir/$c" ]] || have=0
  done
  if [[ $have -eq 1 ]]; then
    summary+=("$(printf '%-30s cached' "$name")")
    return 0
  fi
  echo "build-node.sh: building $name ..." >&2
  t0=$(stamp)
  "$fn" >&2 || { echo "build-node.sh: building $name failed" >&2; exit 1; }
  summary+=("$(printf '%-30s built in %4d s' "$name" $(( $(stamp) - t0 )))")
}

t_all=$(stamp)
run "kubelet, kube-proxy $KUBERNETES_VERSION" "bin/kubelet bin/kube-proxy" build_kubelet
run "coredns $COREDNS_VERSION" bin/coredns build_coredns
run "local-path-provisioner $LOCAL_PATH_PROVISIONER_VERSION" "bin/local-path-provisioner local-path-storage.yaml" \
  build_local_path_provisioner
run "pause" bin/pause build_pause
run "kube-network-policies $KUBE_NETWORK_POLICIES_VERSION" bin/kube-network-policies build_kube_network_policies
run "cert-manager CRDs $CERT_MANAGER_VERSION" "cert-manager-$CERT_MANAGER_VERSION-crds.yaml" fetch_cert_manager_crds
{
  for line in "${summary[@]}"; do echo "build-node.sh: $line"; done
  echo "build-node.sh: $(( $(stamp) - t_all )) s in all, into $dir"
} >&2
echo "$dir/bin"
