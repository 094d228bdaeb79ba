#!/usr/bin/env bash
# Builds the power examples' images (deploy/examples/power/images/*.Containerfile) for linux/amd64 and linux/arm64,
# and the machine room's machine OS (tests/machineroom/machine-os.Containerfile, amd64 only: it stands for a
# machine), with Debian's buildah, from a Debian base made here by mmdebstrap for each platform: it stands in for
# debian:bookworm-slim (no public registry is reachable) and is made by the same recipe (minbase, the slim dpkg
# filters, the minimizing config: tests/machineroom/power_images.py, debian-slim-hook.sh). arm64 RUN steps run under
# qemu, registered for the build only (tests/binfmt.py). Each image is cached by the content of its Containerfile and
# each platform's base key; before it is kept, each image runs `uname -m` and its tools' version commands (the arm64
# ones under emulation) and a power image over 80 MB fails the build. For each, the cache directory holds:
#   rootfs/              the amd64 root filesystem unpacked (what runc runs in the machine room)
#   image.oci.tar        the amd64 image (what a registry or containerd imports), named by the one reference
#   image-arm64.oci.tar  the arm64 image (power images only)
#   index.oci.tar        both as one OCI image index (`skopeo copy --all oci-archive:index.oci.tar docker://...`)
#   tag                  the one reference, localhost/hlmr/<name>:<key>
#   platforms.json       per platform the manifest digest the index names (what a registry serves for it), the size
#                        (bytes, MB), the build's seconds; the index's digest (null for the machine OS: no index)
# and prints `image <name> <platform> <MB> MB` for each image and platform, built or cached (MB: 10^6 bytes of
# uncompressed layers, as `buildah images` counts them). Buildah keeps its storage in the cache, never in the
# machine's /var/lib/containers. Prints the cache directory last, on stdout (everything else: stderr).
#
#   tests/machineroom/images.sh            build what is missing, print the directory
#   tests/machineroom/images.sh --where    print the directory only (nothing is built)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
images="$repo/deploy/examples/power/images"
root=${HOMELAB_POWER_IMAGES:-${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/power-images}
suite=bookworm
power_platforms=(linux/amd64 linux/arm64)
limit_mb=80
if [[ "${1:-}" == "--where" ]]; then
  echo "$root"
  exit 0
fi
for tool in buildah mmdebstrap flock python3 timeout; do
  command -v "$tool" >/dev/null || { echo "images.sh: no '$tool' (run tests/machineroom/setup.sh)" >&2; exit 2; }
done
py() { PYTHONPATH="$repo" python3 -m tests.machineroom.power_images "$@"; }
mkdir -p "$root"
exec 9>"$root/.lock"
flock -w 1800 9 || { echo "images.sh: gave up waiting for the lock on $root/.lock" >&2; exit 1; }
b=(buildah --root "$root/storage" --runroot "$root/runroot" --storage-driver overlay)
stamp() { date +%s; }

# arm64 programs run under qemu while something arm64 is built, and not after: tests/binfmt.py registers
# qemu-aarch64 only if the machine has no entry for it, and removes only what it registered (on exit, even on failure).
holder=""
emulate() {
  [[ -n "$holder" ]] && return 0
  # `python3 -m tests.binfmt on`, with this script's pid as the holder (`on` takes its parent's, here timeout's).
  holder=$(PYTHONPATH="$repo" timeout 120 python3 -c "from tests.binfmt import acquire; print(acquire($$))") ||
    { echo "images.sh: arm64 cannot be emulated here (tests/binfmt.py said why, above)" >&2; exit 2; }
}
unemulate() {
  [[ -z "$holder" ]] && return 0
  PYTHONPATH="$repo" timeout 60 python3 -m tests.binfmt off "$holder" >/dev/null ||
    echo "images.sh: python3 -m tests.binfmt off $holder failed" >&2
  holder=""
}
trap unemulate EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The base of each platform: mmdebstrap's root, as one layer, configured for its architecture. Its key is its
# recipe's content; it is built only when an image on it is.
declare -A base_key base_ref
for arch in amd64 arm64; do
  base_key[$arch]=$(py base-key "$suite" "$arch")
  base_ref[$arch]="localhost/hlmr/debian:${base_key[$arch]}"
done
base() {  # base ARCH
  local arch=$1 ref=${base_ref[$1]} t0 c tar log
  if "${b[@]}" inspect --type image "$ref" >/dev/null 2>&1; then
    return 0
  fi
  [[ "$arch" == amd64 ]] || emulate
  t0=$(stamp)
  tar="$root/.base-$arch-$$.tar"
  log="$root/.base-$arch.log"
  local args
  mapfile -t args < <(py base-args "$suite" "$arch")
  # mmdebstrap checks a foreign architecture runs with arch-test; without it, the base's own maintainer scripts and
  # each image's `uname -m` (below) show that it does.
  [[ "$arch" == amd64 ]] || command -v arch-test >/dev/null || args+=(--skip=check/qemu)
  if ! timeout 1800 mmdebstrap "${args[@]}" "$suite" "$tar" </dev/null >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    rm -f "$tar"
    echo "images.sh: mmdebstrap for $arch failed (all of it: $log)" >&2
    exit 1
  fi
  c=$("${b[@]}" from --arch "$arch" scratch)
  "${b[@]}" add "$c" "$tar" / >/dev/null
  "${b[@]}" config --os linux --arch "$arch" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
  "${b[@]}" commit --quiet "$c" "$ref" >/dev/null
  "${b[@]}" rm "$c" >/dev/null
  rm -f "$tar"
  local nbytes
  nbytes=$("${b[@]}" inspect --type image "$ref" | py bytes)
  echo "images.sh: base $ref linux/$arch built in $(( $(stamp) - t0 )) s, $nbytes bytes" >&2
}

# One platform's image: built, its tools run in it (arm64's under emulation), its archive written, its size kept.
build_platform() {  # build_platform NAME FILE CONTEXT OUT REFERENCE PLATFORM LIMIT_MB
  local name=$1 file=$2 context=$3 out=$4 reference=$5 platform=$6 limit=$7
  local arch=${platform#linux/} t0 key tag c mnt cmd said expect
  [[ -f "$out/.platform-$arch.json" ]] && return 0
  base "$arch"
  [[ "$arch" == amd64 ]] || emulate
  t0=$(stamp)
  key=$(py key "$file" "$platform=${base_key[$arch]}")
  tag="localhost/hlmr/$name:$key"
  timeout 3600 "${b[@]}" bud --quiet --network host --layers=false --pull=never --arch "$arch" \
    --build-arg "BASE_IMAGE=${base_ref[$arch]}" -t "$tag" -f "$file" "$context" >&2
  c=$("${b[@]}" from --pull-never --arch "$arch" "$tag")
  expect=$(py machine "$platform")
  said=$(timeout 300 "${b[@]}" run --network host "$c" -- uname -m 2>&1 </dev/null) || said="failed: $said"
  echo "images.sh: $name $platform: uname -m: $said" >&2
  if [[ "$said" != "$expect" ]]; then
    "${b[@]}" rm "$c" >/dev/null
    echo "images.sh: $name $platform: uname -m said '$said', not $expect" >&2
    exit 1
  fi
  local checks
  mapfile -t checks < <(py checks "$name")
  for cmd in "${checks[@]}"; do
    [[ -n "$cmd" ]] || continue
    # With the capabilities a container runtime grants by default (containerd's, docker's; buildah's lacks NET_RAW,
    # and the kernel refuses to run ping, whose file capability asks for it, without it).
    # shellcheck disable=SC2086 # the command's words
    if ! said=$(timeout 300 "${b[@]}" run --network host --cap-add CAP_NET_RAW "$c" -- $cmd 2>&1 </dev/null); then
      "${b[@]}" rm "$c" >/dev/null
      echo "images.sh: $name $platform: '$cmd' does not run: $said" >&2
      exit 1
    fi
    echo "images.sh: $name $platform: $cmd: ${said%%$'\n'*}" >&2
  done
  if [[ "$arch" == amd64 ]]; then
    mnt=$("${b[@]}" mount "$c")
    rm -rf "$out/rootfs"
    mkdir -p "$out/rootfs"
    cp -a "$mnt/." "$out/rootfs/"
    "${b[@]}" umount "$c" >/dev/null
  fi
  "${b[@]}" rm "$c" >/dev/null
  local archive
  archive="$out/$( [[ "$arch" == amd64 ]] && echo image.oci.tar || echo "image-$arch.oci.tar" )"
  rm -f "$archive"
  "${b[@]}" push --quiet "$tag" "oci-archive:$archive:$reference" >&2
  "${b[@]}" inspect --type image "$tag" | py record "$out" "$platform" "$(( $(stamp) - t0 ))" "$limit"
  echo "images.sh: $name $platform built in $(( $(stamp) - t0 )) s" >&2
}

build() {  # build NAME CONTAINERFILE CONTEXT LIMIT_MB PLATFORM...
  local name=$1 file=$2 context=$3 limit=$4
  shift 4
  local platforms=("$@") p bases=() key out reference
  for p in "${platforms[@]}"; do
    bases+=("$p=${base_key[${p#linux/}]}")
  done
  key=$(py key "$file" "${bases[@]}")
  out="$root/$name-$key"
  reference="localhost/hlmr/$name:$key"
  if [[ -f "$out/done" ]]; then
    ln -sfn "$name-$key" "$root/$name"
    echo "images.sh: $name cached ($out)" >&2
    py lines "$name" "$out" >&2
    return 0
  fi
  mkdir -p "$out"
  rm -f "$out/index.oci.tar" "$out/platforms.json"
  for p in "${platforms[@]}"; do
    build_platform "$name" "$file" "$context" "$out" "$reference" "$p" "$limit"
  done
  if ((${#platforms[@]} > 1)); then
    # The one reference: an OCI image index of every platform's image, as `buildah manifest push --all` writes it.
    if "${b[@]}" manifest inspect "$reference" >/dev/null 2>&1; then
      "${b[@]}" rmi "$reference" >/dev/null
    fi
    "${b[@]}" manifest create "$reference" >/dev/null
    for p in "${platforms[@]}"; do
      "${b[@]}" manifest add "$reference" \
        "containers-storage:localhost/hlmr/$name:$(py key "$file" "$p=${base_key[${p#linux/}]}")" >/dev/null
    done
    "${b[@]}" manifest push --quiet --all --format oci "$reference" "oci-archive:$out/index.oci.tar:$reference" >&2
  fi
  py platforms "$name" "$out" "$reference" >&2
  echo "$reference" >"$out/tag"
  touch "$out/done"
  ln -sfn "$name-$key" "$root/$name"
}

for f in "$images"/*.Containerfile; do
  n=$(basename "$f" .Containerfile)
  build "power-$n" "$f" "$images" "$limit_mb" "${power_platforms[@]}"
done
unemulate
build machine-os "$here/machine-os.Containerfile" "$here" 0 linux/amd64
echo "$root"
