#!/bin/sh
# mmdebstrap's customize hook for the stand-in base (tests/machineroom/images.sh; $1 is the new root): what the
# official debian:bookworm-slim sets for container builds (debuerreotype's minimizing config), so a Containerfile
# keeps on the stand-in what it keeps on the official base: apt leaves no .deb archives and no package caches after
# an install, keeps its indexes compressed and fetches no translations; services are not started by an install;
# dpkg does not sync. And what the official image does not ship: the bootstrap's logs, the host's resolv.conf.
set -eu
root=$1
cat >"$root/usr/sbin/policy-rc.d" <<'POLICY'
#!/bin/sh
# An image build starts no service (invoke-rc.d asks this first).
exit 101
POLICY
chmod 0755 "$root/usr/sbin/policy-rc.d"
clean='"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<CLEAN
// No .deb archives and no package caches left in an image's layer after an install or an update.
DPkg::Post-Invoke { $clean };
APT::Update::Post-Invoke { $clean };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CLEAN
cat >"$root/etc/apt/apt.conf.d/docker-gzip-indexes" <<'GZIP'
// The indexes stay compressed on disk (for an image that keeps them).
Acquire::GzipIndexes "true";
GZIP
cat >"$root/etc/apt/apt.conf.d/docker-no-languages" <<'LANGUAGES'
// No translated descriptions fetched.
Acquire::Languages "none";
LANGUAGES
cat >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests" <<'SUGGESTS'
// autoremove also takes what stayed only because something suggests it.
Apt::AutoRemove::SuggestsImportant "false";
SUGGESTS
chmod 0644 "$root"/etc/apt/apt.conf.d/docker-*
# apt's caches of the bootstrap (mmdebstrap's cleanup would not find them once Dir::Cache::pkgcache is "").
rm -f "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
rm -f "$root/var/log/dpkg.log" "$root/var/log/bootstrap.log" "$root/var/log/alternatives.log" \
  "$root/var/log/apt/history.log" "$root/var/log/apt/term.log" "$root/var/log/apt/eipp.log.xz" \
  "$root/var/cache/ldconfig/aux-cache" "$root/etc/resolv.conf" "$root/etc/hostname"
