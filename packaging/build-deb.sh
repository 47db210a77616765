#!/usr/bin/env bash
# Builds the Debian packages esid and libnginx-mod-http-esi from this tree
# and checks them with lintian.
#
#     packaging/build-deb.sh [OUTDIR]      # default: build-packages/deb
#
# The tree (every file git tracks or would track, as it is in the work tree)
# is copied to a scratch directory with packaging/debian/ as debian/, and
# built there with `dpkg-buildpackage -us -uc -b`; the .debs land in OUTDIR.
# Exits non-zero when the build fails or lintian reports an error (warnings
# are printed, not fatal).  DEB_BUILD_OPTIONS is honoured: nocheck skips the
# unit tests.  Needs the Build-Depends of packaging/debian/control, lintian
# and git (packaging/deps.sh installs them).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build-packages/deb}")
jobs=${ESI_JOBS:-2}

# Packages of an earlier build go first: if this one fails, nothing in
# OUTDIR may pass for its output (ci-packages.sh installs what is there).
mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo

scratch=$(mktemp -d /tmp/esi-deb.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
src=$scratch/esi
mkdir -p "$src"

# Files deleted in the work tree but still tracked are skipped.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$root" && tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) |
    tar -xf - -C "$src"
rm -rf "$src/debian"
cp -r "$root/packaging/debian" "$src/debian"

echo "build-deb: building in $src"
(cd "$src" && dpkg-buildpackage -us -uc -b -j"$jobs")

cp "$scratch"/*.deb "$scratch"/*.changes "$scratch"/*.buildinfo "$out"/

echo "build-deb: lintian"
# --fail-on error: warnings and info are reported, only errors fail.
lintian --info --display-info --fail-on error "$out"/*.changes
echo "build-deb: packages in $out:"
ls -1 "$out"/*.deb
