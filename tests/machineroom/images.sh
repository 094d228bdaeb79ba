#!/usr/bin/env bash
# Builds the power examples' images (deploy/examples/power/images/*.Containerfile) and the machine room's machine OS
# (tests/machineroom/machine-os.Containerfile) with Debian's buildah, from a Debian base made here by mmdebstrap
# (it stands in for debian:bookworm-slim: no public registry is reachable). Each image is cached by the content of
# its Containerfile and the base's key; for each, the cache holds its OCI archive (what a registry or containerd
# imports) and its root filesystem unpacked (what runc runs until the real node of issue 30 runs Pods).
# Buildah keeps its storage in the cache, never in the machine's /var/lib/containers. Prints the cache directory.
#
#   tests/machineroom/images.sh            build what is missing, print the directory
#   tests/machineroom/images.sh --where    print the directory only (nothing is built)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
images="$repo/deploy/examples/power/images"
root=${HOMELAB_POWER_IMAGES:-${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/power-images}
suite=bookworm
base_key="debian-$suite-minbase-1"
if [[ "${1:-}" == "--where" ]]; then
  echo "$root"
  exit 0
fi
for tool in buildah mmdebstrap flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "images.sh: no '$tool' on PATH (run tests/machineroom/setup.sh)" >&2; exit 2; }
done
mkdir -p "$root"
exec 9>"$root/.lock"
flock -w 1800 9 || { echo "images.sh: gave up waiting for the lock on $root/.lock" >&2; exit 1; }
b=(buildah --root "$root/storage" --runroot "$root/runroot" --storage-driver overlay)
stamp() { date +%s; }

# The base: Debian's minbase variant of the suite, from the machine's own apt sources, as one layer.
base="localhost/hlmr/debian:$base_key"
if ! "${b[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  t0=$(stamp)
  tar="$root/.base-$$.tar"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates "$suite" "$tar" >&2
  c=$("${b[@]}" from scratch)
  "${b[@]}" add "$c" "$tar" / >/dev/null
  "${b[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
  "${b[@]}" commit --quiet "$c" "$base" >/dev/null
  "${b[@]}" rm "$c" >/dev/null
  rm -f "$tar"
  echo "images.sh: base $base built in $(( $(stamp) - t0 )) s" >&2
fi

build() {  # build NAME CONTAINERFILE CONTEXT
  local name=$1 file=$2 context=$3 key t0 c mnt
  key=$(cat "$file" <(echo "$base_key") | sha256sum | cut -c1-16)
  local out="$root/$name-$key"
  if [[ -f "$out/done" ]]; then
    ln -sfn "$name-$key" "$root/$name"
    echo "images.sh: $name cached ($out)" >&2
    return 0
  fi
  t0=$(stamp)
  rm -rf "$out" && mkdir -p "$out"
  local tag="localhost/hlmr/$name:$key"
  "${b[@]}" bud --quiet --network host --layers=false --build-arg "BASE_IMAGE=$base" -t "$tag" -f "$file" "$context" >&2
  "${b[@]}" push --quiet "$tag" "oci-archive:$out/image.oci.tar:$tag" >&2
  c=$("${b[@]}" from --pull-never "$tag")
  mnt=$("${b[@]}" mount "$c")
  mkdir -p "$out/rootfs"
  cp -a "$mnt/." "$out/rootfs/"
  "${b[@]}" umount "$c" >/dev/null
  "${b[@]}" rm "$c" >/dev/null
  echo "$tag" >"$out/tag"
  touch "$out/done"
  ln -sfn "$name-$key" "$root/$name"
  echo "images.sh: $name built in $(( $(stamp) - t0 )) s ($out)" >&2
}

for f in "$images"/*.Containerfile; do
  n=$(basename "$f" .Containerfile)
  build "power-$n" "$f" "$images"
done
build machine-os "$here/machine-os.Containerfile" "$here"
echo "$root"
