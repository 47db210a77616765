#!/usr/bin/env bash
# Builds the RPMs esid and nginx-mod-http-esi from this tree with rpmbuild
# and packaging/rpm/esi.spec.
#
#     packaging/build-rpm.sh [OUTDIR]      # default: build-packages/rpm
#
# The tree (every file git tracks or would track, as it is in the work tree)
# becomes Source0, esi-VERSION.tar.gz, in a scratch _topdir; the binary RPMs
# land in OUTDIR.  Here, on Debian, rpmbuild comes from Debian's rpm package
# and builds against Debian's packages and nginx-dev tree (see the spec).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build-packages/rpm}")
spec=$root/packaging/rpm/esi.spec
jobs=${ESI_JOBS:-2}
version=$(sed -n 's/^Version:[[:space:]]*//p' "$spec")

# RPMs of an earlier build go first: if this one fails, nothing in OUTDIR
# may pass for its output.
mkdir -p "$out"
rm -f "$out"/*.rpm

scratch=$(mktemp -d /tmp/esi-rpm.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch"/{BUILD,RPMS,SOURCES,SPECS,SRPMS}

# Files deleted in the work tree but still tracked are skipped.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$root" && tar --null --files-from=- --ignore-failed-read \
        --transform "s,^,esi-$version/," -czf - 2>/dev/null) \
    >"$scratch/SOURCES/esi-$version.tar.gz"

# --nodeps: rpmbuild checks BuildRequires against the RPM database, which on
# Debian is empty (the build dependencies are Debian packages, checked by
# dpkg; packaging/deps.sh installs them), and Debian's rpm lacks Fedora's
# macros that would map them; without it every BuildRequires is "missing".
echo "build-rpm: building in $scratch"
rpmbuild --nodeps \
    --define "_topdir $scratch" \
    --define "_smp_mflags -j$jobs" \
    -bb "$spec"

mkdir -p "$out"
rm -f "$out"/*.rpm
find "$scratch/RPMS" -name '*.rpm' -exec cp {} "$out"/ \;
for rpm in "$out"/*.rpm; do
    echo "== $(basename "$rpm")"
    rpm -qp --requires "$rpm" 2>/dev/null | sed 's/^/   requires: /'
    rpm -qlp "$rpm" 2>/dev/null | sed 's/^/   /'
done
