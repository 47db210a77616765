#!/usr/bin/env bash
# The connector against other builds of NGINX than Debian's (tests/README.md,
# "Build matrix"): Debian's nginx source configured three ways, the module
# built with each, and integration tests run against each.
#
#   nogzip   dynamic module; --without-http_gzip_module but with gunzip, so
#            NGINX has zlib and the module still inflates gzipped pages
#   nozlib   dynamic module; no gzip and no gunzip module, so NGINX has no
#            zlib: the module's configure says so and gzipped pages pass
#            unprocessed
#   static   the module compiled into nginx (--add-module), gzip and gunzip
#   moved    dynamic module, gzip; the source patched so that a member more
#            starts the gzip filter's and the proxy module's location
#            configurations and follows the cache file header's version:
#            "nginx -t" must fail naming each layout that moved (the others,
#            built from their own source, must pass it)
#
#   tests/build-matrix.sh [BUILD_DIR]
#
# BUILD_DIR (default build/) holds a built esid, which the tests run; the
# NGINX trees are kept in BUILD_DIR/matrix and configured again only when
# their flags, the module's config or this script change (make rebuilds what
# changed).  Ends with "build-matrix: N passed, N failed, N skipped": per
# variant, one entry for its build (configure's zlib message and NGX_ZLIB as
# expected, the patch applied, then make) and one for each of its test methods
# (integration/run_counted.py, counted by tests/gate_count.py: a skip that
# tests/expected-skips does not list fails), or one failure for its tests
# when they could not run.
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
build=$(realpath -m "${1:-build}")
matrix=$build/matrix
jobs=${ESI_JOBS:-2}
passed=0
failed=0
skipped=0

pass() { passed=$((passed + 1)); echo "build-matrix: $*: ok"; }
fail() { failed=$((failed + 1)); echo "build-matrix: FAILED $*"; }

if [ ! -x "$build/esid" ] || [ ! -f "$build/proto/c/esi_wire_layout.h" ]; then
    echo "build-matrix: no built esid in $build (cmake --build $build)"
    echo "build-matrix: 0 passed, 8 failed, 0 skipped"
    exit 1
fi

# Debian's nginx source, once per build tree (tests/sanitize/nginx.sh
# fetches it as the sanitized build does).
if [ ! -f "$matrix/source/src/configure" ]; then
    if ! bash tests/sanitize/nginx.sh fetch "$matrix/source"; then
        echo "build-matrix: could not fetch nginx's source"
        echo "build-matrix: 0 passed, 8 failed, 0 skipped"
        exit 1
    fi
fi

# Only what the tests use: proxy, proxy_cache, HTTP/2 (the markup and gzip
# tests run over it too) and the temp paths the harness sets; every other
# optional module left out to keep builds short.
common=(
    --with-http_v2_module
    --with-cc-opt="-g -O1 -Wall -Werror -I$root/include -I$build/proto/c"
    --without-http_charset_module --without-http_ssi_module
    --without-http_userid_module --without-http_access_module
    --without-http_auth_basic_module --without-http_mirror_module
    --without-http_autoindex_module --without-http_geo_module
    --without-http_map_module --without-http_split_clients_module
    --without-http_referer_module --without-http_rewrite_module
    --without-http_grpc_module --without-http_memcached_module
    --without-http_limit_conn_module --without-http_limit_req_module
    --without-http_empty_gif_module --without-http_browser_module
    --without-http_upstream_hash_module --without-http_upstream_ip_hash_module
    --without-http_upstream_least_conn_module
    --without-http_upstream_random_module
    --without-http_upstream_keepalive_module
    --without-http_upstream_zone_module
)
connector=$root/nginx-connector
# name | how the module is linked | more configure flags | zlib (1/0) |
# layouts (kept: NGINX's own source; moved: move_layouts) | tests
variants=(
    "nogzip|--add-dynamic-module=$connector|--without-http_gzip_module --with-http_gunzip_module|1|kept|test_markup test_headers test_build_matrix test_layout"
    "nozlib|--add-dynamic-module=$connector|--without-http_gzip_module|0|kept|test_markup test_headers test_build_matrix test_layout"
    "static|--add-module=$connector|--with-http_gunzip_module|1|kept|test_markup test_headers test_cache test_gzip test_defaults test_layout"
    "moved|--add-dynamic-module=$connector||1|moved|test_layout"
)
config_hash=$(cat "$connector/config" "$0" | sha256sum | cut -d' ' -f1)

# The private structures the module reads (README, "What the module reads
# of NGINX's private structures"), each with a member more where the module
# does not expect one: before the gzip filter's "gzip" flag, before the
# ngx_http_upstream_conf_t that starts the proxy module's location
# configuration (ngx_http_proxy_module.h in newer NGINX), and after the cache
# file header's version.  Each must change exactly one place.
move_layouts() {
    local src=$1/src/http proxy
    proxy=$src/modules/ngx_http_proxy_module.h
    [ -f "$proxy" ] || proxy=$src/modules/ngx_http_proxy_module.c
    perl -0pi -e 's/(typedef struct \{\n)(\s+ngx_flag_t\s+enable;)/$1    ngx_flag_t esi_moved;\n$2/' \
        "$src/modules/ngx_http_gzip_filter_module.c" &&
    perl -0pi -e 's/(typedef struct \{\n)(\s+ngx_http_upstream_conf_t\s+upstream;)/$1    ngx_uint_t esi_moved;\n$2/' \
        "$proxy" &&
    perl -0pi -e 's/(typedef struct \{\n\s+ngx_uint_t\s+version;\n)/$1    ngx_uint_t esi_moved;\n/' \
        "$src/ngx_http_cache.h" || return 1
    local f
    for f in "$src/modules/ngx_http_gzip_filter_module.c" "$proxy" \
             "$src/ngx_http_cache.h"; do
        if [ "$(grep -c esi_moved "$f")" != 1 ]; then
            echo "build-matrix: moved: $f not patched once"
            return 1
        fi
    done
}

# Configures (when needed) and builds one variant in $matrix/NAME/tree.
build_variant() {
    local name=$1 link=$2 flags=$3 zlib=$4 layout=$5
    local dir=$matrix/$name tree=$matrix/$name/tree
    local stamp
    stamp="$config_hash $link $flags $layout"
    if [ ! -f "$dir/configured" ] || [ "$(cat "$dir/configured")" != "$stamp" ]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        cp -a "$matrix/source/src" "$tree"
        if [ "$layout" = moved ] && ! move_layouts "$tree"; then
            return 1
        fi
        # shellcheck disable=SC2086
        if ! (cd "$tree" && ./configure "${common[@]}" $flags "$link") \
                >"$dir/configure.log" 2>&1; then
            tail -n 20 "$dir/configure.log"
            return 1
        fi
        echo "$stamp" >"$dir/configured"
    fi
    # The capability that needs zlib says so at configure time.
    local said=0 have=0
    grep -q 'ngx_http_esi_module: no zlib' "$dir/configure.log" && said=1
    grep -q '^#define NGX_ZLIB  *1' "$tree/objs/ngx_auto_config.h" && have=1
    if [ "$have" != "$zlib" ] || [ "$said" = "$zlib" ]; then
        echo "build-matrix: $name: NGX_ZLIB $have, zlib message $said;" \
             "expected zlib $zlib"
        return 1
    fi
    if ! make -C "$tree" -j"$jobs" >"$dir/make.log" 2>&1; then
        grep -E 'error|Error' "$dir/make.log" | head -n 20
        return 1
    fi
}

for v in "${variants[@]}"; do
    IFS='|' read -r name link flags zlib layout tests <<<"$v"
    echo "build-matrix: $name: $link $flags"
    if ! build_variant "$name" "$link" "$flags" "$zlib" "$layout"; then
        fail "$name build"
        fail "$name tests (not run)"
        continue
    fi
    pass "$name build"
    tree=$matrix/$name/tree
    module=builtin
    [ "$name" = static ] || module=$tree/objs/ngx_http_esi_module.so
    results=$matrix/$name/results
    rm -rf "$results"
    # shellcheck disable=SC2086
    (cd tests/integration &&
        ESI_NGINX=$tree/objs/nginx ESI_MODULE=$module ESI_BUILD_DIR=$build \
        ESI_SOURCE_DIR=$root ESI_MATRIX_ZLIB=$zlib \
        ESI_MATRIX_LAYOUT=$layout PYTHONDONTWRITEBYTECODE=1 \
        ESI_RESULTS_DIR=$results \
        python3 run_counted.py $tests) >"$matrix/$name/tests.log" 2>&1
    rc=$?
    # shellcheck disable=SC2086
    count=$(python3 tests/gate_count.py --name "$name" --results "$results" \
            --modules $tests)
    sed -n "s/^$name: FAILED /build-matrix: FAILED $name: /p;
            s/^$name: skipped /build-matrix: skipped $name: /p" <<<"$count"
    line=$(tail -n 1 <<<"$count")
    if ! [[ $line =~ ^$name:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
        tail -n 60 "$matrix/$name/tests.log"
        fail "$name tests (not counted)"
        continue
    fi
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    skipped=$((skipped + BASH_REMATCH[3]))
    echo "build-matrix: $name tests: ${BASH_REMATCH[1]} passed," \
         "${BASH_REMATCH[2]} failed, ${BASH_REMATCH[3]} skipped"
    if [ "${BASH_REMATCH[2]}" -ne 0 ] || [ "$rc" -ne 0 ]; then
        tail -n 60 "$matrix/$name/tests.log"
        [ "${BASH_REMATCH[2]}" -ne 0 ] || fail "$name tests (unittest exited $rc)"
    fi
done

echo "build-matrix: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
