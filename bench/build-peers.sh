#!/usr/bin/env bash
# The NGINX purge modules bench/purge_peers.py measures ours against, built
# as dynamic modules for Debian's nginx the way ours is: Debian's nginx-dev
# tree (/usr/share/nginx/src) configured with Debian's own flags
# (conf_flags: --with-compat, --with-threads, ...) and the module, then
# `make -f objs/Makefile modules`.  One tree per module; a module already
# built from the same tarball is kept.
#
#   bench/build-peers.sh PEERS_DIR OUT_DIR
#
#   PEERS_DIR  holds ngx_cache_purge-3.0.1.tar.gz and
#              ngx_cache_pilot-2.0.0.tar.gz (`git archive` of each release
#              tag: /work/shared/peers, see its README.md)
#   OUT_DIR    gets ngx_cache_purge-3.0.1/ and ngx_cache_pilot-2.0.0/, each
#              with its tree and its module .so
#
# Prints the paths of the two modules, last.
set -euo pipefail

peers=${1:?usage: build-peers.sh PEERS_DIR OUT_DIR}
out=${2:?usage: build-peers.sh PEERS_DIR OUT_DIR}
src=/usr/share/nginx/src
die() { echo "build-peers: $*" >&2; exit 1; }
[ -f "$src/conf_flags" ] || die "$src missing: apt-get install nginx-dev"
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Debian's flags for its modules (nginx-connector/CMakeLists.txt's, less
# -Werror: these are others' sources).
cc_opt="-g -O2 -fstack-protector-strong -Wformat -Werror=format-security"
cc_opt+=" -fPIC -D_FORTIFY_SOURCE=2"
built=()
for name in ngx_cache_purge-3.0.1:ngx_http_cache_purge_module \
            ngx_cache_pilot-2.0.0:ngx_http_cache_pilot_module; do
    peer=${name%%:*}
    so=${name#*:}.so
    tarball=$peers/$peer.tar.gz
    [ -f "$tarball" ] || die "$tarball missing"
    dir=$out/$peer
    stamp=$(sha256sum "$tarball" | cut -d' ' -f1)
    if [ ! -f "$dir/$so" ] ||
            [ "$(cat "$dir/stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "build-peers: building $peer for nginx" \
            "$(nginx -v 2>&1 | sed 's/.*\///')" >&2
        rm -rf "$dir"
        mkdir -p "$dir/module"
        tar -xzf "$tarball" -C "$dir/module" --strip-components=1
        cp -r "$src" "$dir/tree"
        (
            cd "$dir/tree"
            . ./conf_flags
            ./configure "${NGX_CONF_FLAGS[@]}" \
                --add-dynamic-module="$dir/module" \
                --with-cc-opt="$cc_opt" \
                --with-ld-opt="-Wl,-z,relro -Wl,-z,now -fPIC" \
                >configure.log 2>&1
            make -j"${ESI_JOBS:-2}" -f objs/Makefile modules >make.log 2>&1
        ) || die "$peer failed; see $dir/tree/*.log"
        cp "$dir/tree/objs/$so" "$dir/$so"
        echo "$stamp" >"$dir/stamp"
    fi
    built+=("$dir/$so")
done
printf '%s\n' "${built[@]}"
