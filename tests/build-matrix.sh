#!/usr/bin/env bash
# The connector against other builds of NGINX than Debian's packaged one
# (tests/README.md, "Build matrix"): Debian's nginx source configured three
# ways, and every NGINX source tarball in ESI_NGINX_SOURCES (default: the
# shared trees, ../shared/nginx beside the checkout) as a dynamic module
# (--with-compat) and as a static one, each built with -Werror by
# packaging/build-module.sh, and integration tests run against each.
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
#            "nginx -t" must fail naming each layout that moved (every other
#            variant, built from its own source, must pass it)
#   movedkey dynamic module; the source patched so that a member more
#            comes before the proxy module's cache key: "nginx -t" passes,
#            but for a same-location purge, where it names the fix
#   VERSION  each tarball's nginx with the module as a dynamic module, the
#            newest (mainline) with nginx.org's package arguments and
#            --with-debug (nginx.org's nginx-debug), the others with the
#            modules the tests use; test_smoke against each.  The newest is
#            left at BUILD_DIR/matrix/mainline for run.sh's whole suite.
#            test_layout's kept layouts on each.
#   VERSION-static  the same tree with the module compiled in: built only
#   VERSION-fornginx  the newest's module built for its nginx binary
#            (build-module.sh --nginx, as users build it), loaded into it:
#            test_smoke, test_cache_purge_compat (needs its SSL)
#   VERSION-nocompat  the newest's module without --with-compat: test_abi
#            loads it, and the version before's, into the newest nginx,
#            which must refuse both
#
#   tests/build-matrix.sh [BUILD_DIR]
#
# BUILD_DIR (default build/) holds a built esid, which the tests run; the
# NGINX trees are kept in BUILD_DIR/matrix and configured again only when
# their flags, the module's config or the scripts change (make rebuilds what
# changed).  Ends with "build-matrix: N passed, N failed, N skipped": per
# variant, one entry for its build (for Debian's source: configure's zlib
# message and NGX_ZLIB as expected, the patch applied, then make) and one
# for each of its test
# methods (integration/run_counted.py, counted by tests/gate_count.py: a
# skip that tests/expected-skips does not list fails), or one failure for
# its tests when they could not run.  No tarball found is one failure: the
# versions must not drop out of CI unseen.
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
build=$(realpath -m "${1:-build}")
matrix=$build/matrix
sources=${ESI_NGINX_SOURCES:-$(realpath -m "$root/../shared/nginx")}
jobs=${ESI_JOBS:-2}
passed=0
failed=0
skipped=0

pass() { passed=$((passed + 1)); echo "build-matrix: $*: ok"; }
fail() { failed=$((failed + 1)); echo "build-matrix: FAILED $*"; }

if [ ! -x "$build/esid" ] || [ ! -f "$build/proto/c/esi_wire_layout.h" ]; then
    echo "build-matrix: no built esid in $build (cmake --build $build)"
    echo "build-matrix: 0 passed, 10 failed, 0 skipped"
    exit 1
fi

# Debian's nginx source, once per build tree (tests/sanitize/nginx.sh
# fetches it as the sanitized build does).
if [ ! -f "$matrix/source/src/configure" ]; then
    if ! bash tests/sanitize/nginx.sh fetch "$matrix/source"; then
        echo "build-matrix: could not fetch nginx's source"
        echo "build-matrix: 0 passed, 10 failed, 0 skipped"
        exit 1
    fi
fi

# Only what the tests use: proxy, proxy_cache, HTTP/2 (the markup and gzip
# tests run over it too) and the temp paths the harness sets; every other
# optional module left out to keep builds short.
common=(
    --with-http_v2_module
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
debian=$matrix/source/src
moved=$matrix/moved-source
movedkey=$matrix/movedkey-source

# The private structures the module reads (docs/architecture.md, "What the module reads
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

# The proxy module's cache key, which only a same-location purge reads
# (ngx_http_esi_layout_cache_key()), with a member more before it: nothing
# else moves, so "nginx -t" passes but where such a purge is configured.
move_cache_key() {
    local proxy=$1/src/http/modules/ngx_http_proxy_module.h
    [ -f "$proxy" ] || proxy=$1/src/http/modules/ngx_http_proxy_module.c
    perl -0pi -e 's/(\n\s+ngx_str_t\s+url;\n)/$1    ngx_uint_t esi_moved;\n/' \
        "$proxy" || return 1
    if [ "$(grep -c esi_moved "$proxy")" != 1 ]; then
        echo "build-matrix: movedkey: $proxy not patched once"
        return 1
    fi
}

# Debian's source with its layouts moved (DIR, by FUNCTION), made again
# (and its variant rebuilt) when this script changes.
moved_stamp=$(sha256sum "$0" | cut -d' ' -f1)
prepare_moved() {
    local dir=$1 move=$2 name=$3
    if [ "$(cat "$dir/stamp" 2>/dev/null)" != "$moved_stamp" ]; then
        rm -rf "$dir" "${matrix:?}/$name"
        cp -a "$debian" "$dir"
        if "$move" "$dir"; then
            echo "$moved_stamp" >"$dir/stamp"
        fi
    fi
}
prepare_moved "$moved" move_layouts moved
prepare_moved "$movedkey" move_cache_key movedkey

# name | source | dynamic or static | more configure flags | zlib (1/0) |
# layouts (kept: NGINX's own source; moved) | tests
variants=(
    "nogzip|$debian|dynamic|--without-http_gzip_module --with-http_gunzip_module|1|kept|test_markup test_headers test_build_matrix test_layout"
    "nozlib|$debian|dynamic|--without-http_gzip_module|0|kept|test_markup test_headers test_build_matrix test_layout"
    "static|$debian|static|--with-http_gunzip_module|1|kept|test_markup test_headers test_cache test_gzip test_defaults test_layout"
    "moved|$moved|dynamic||1|moved|test_layout"
    "movedkey|$movedkey|dynamic||1|movedkey|test_layout"
)
tarballs=$(ls "$sources"/nginx-*.tar.gz 2>/dev/null | sort -V)
newest=$(tail -n 1 <<<"$tarballs")
# Modules NGINX must refuse at load_module (test_abi, against the newest):
# one built for the version before it, one for it without --with-compat.
foreign=
for tarball in $tarballs; do
    version=$(basename "$tarball" .tar.gz)
    version=${version#nginx-}
    flags="--with-compat --with-http_gunzip_module --with-threads"
    tests="test_smoke test_layout"
    if [ "$tarball" = "$newest" ]; then
        variants+=("$version-nocompat|$tarball|module|--with-http_gunzip_module|1|kept|")
        foreign="$foreign $matrix/$version-nocompat/ngx_http_esi_module.so"
        flags="--args-file=$root/packaging/nginx.org-configure-args --with-debug"
        tests="$tests test_abi"
    else
        previous=$matrix/$version/ngx_http_esi_module.so
    fi
    variants+=("$version|$tarball|dynamic|$flags|1|kept|$tests"
               "$version-static|$tarball|static|--with-http_gunzip_module|1|kept|")
done
foreign="${previous:-}$foreign"
# The module for an nginx already installed, as README's users build it
# (build-module.sh --nginx BIN): here the newest's nginx, which has
# --with-compat and SSL; test_cache_purge_compat needs SSL in the module
# (an https upstream's default key).
if [ -n "$newest" ]; then
    version=$(basename "$newest" .tar.gz)
    version=${version#nginx-}
    variants+=("$version-fornginx|$newest|module|--nginx=$matrix/$version/nginx|1|kept|test_smoke test_cache_purge_compat|$matrix/$version/nginx")
fi
if [ -z "$tarballs" ]; then
    failed=$((failed + 1))
    echo "build-matrix: FAILED no nginx-*.tar.gz in $sources"
fi

# Configures (when needed) and builds one variant in $matrix/NAME.
build_variant() {
    local name=$1 source=$2 link=$3 flags=$4 zlib=$5
    local dir=$matrix/$name
    [ -f "$source/stamp" ] ||
        { [ "$source" != "$moved" ] && [ "$source" != "$movedkey" ]; } ||
        return 1
    local opts=(--out "$dir" --build-dir "$build" --cc-opt "-g -O1")
    case $link in
        static) opts+=(--static) ;;
        dynamic) opts+=(--binary) ;;
    esac
    local extra=() file
    case $flags in
        --nginx=*)
            opts+=(--nginx "${flags#--nginx=}")
            flags=
            ;;
        --args-file=*)
            file=${flags%% *}
            opts+=(--args-file "${file#--args-file=}")
            flags=${flags#* }
            ;;
    esac
    # Debian's source gets the minimal module list; a tarball the flags as
    # given.
    case $source in "$debian"|"$moved"|"$movedkey") extra=("${common[@]}") ;; esac
    # shellcheck disable=SC2206
    extra+=($flags)
    if ! ESI_JOBS=$jobs bash packaging/build-module.sh "${opts[@]}" \
            "$source" -- "${extra[@]}" >"$matrix/$name.log" 2>&1; then
        tail -n 20 "$matrix/$name.log"
        return 1
    fi
    # The capability that needs zlib says so at configure time.
    local said=0 have=0
    grep -q 'ngx_http_esi_module: no zlib' "$dir/configure.log" && said=1
    grep -q '^#define NGX_ZLIB  *1' "$dir/tree/objs/ngx_auto_config.h" &&
        have=1
    if [ "$have" != "$zlib" ] || [ "$said" = "$zlib" ]; then
        echo "build-matrix: $name: NGX_ZLIB $have, zlib message $said;" \
             "expected zlib $zlib"
        return 1
    fi
}

mkdir -p "$matrix"
for v in "${variants[@]}"; do
    IFS='|' read -r name source link flags zlib layout tests runner <<<"$v"
    echo "build-matrix: $name: $(basename "$source") $link $flags"
    if ! build_variant "$name" "$source" "$link" "$flags" "$zlib"; then
        fail "$name build"
        [ -z "$tests" ] || fail "$name tests (not run)"
        continue
    fi
    pass "$name build"
    [ -n "$tests" ] || continue
    module=builtin
    [ "$link" = static ] || module=$matrix/$name/ngx_http_esi_module.so
    results=$matrix/$name/results
    rm -rf "$results"
    # shellcheck disable=SC2086
    (cd tests/integration &&
        ESI_NGINX=${runner:-$matrix/$name/nginx} ESI_MODULE=$module \
        ESI_BUILD_DIR=$build \
        ESI_SOURCE_DIR=$root ESI_MATRIX_ZLIB=$zlib \
        ESI_MATRIX_LAYOUT=$layout ESI_MATRIX_FOREIGN="$foreign" \
        PYTHONDONTWRITEBYTECODE=1 \
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

# The newest version, for run.sh's whole suite.
[ -z "$newest" ] || ln -sfn "$(basename "$newest" .tar.gz | sed 's/^nginx-//')" \
    "$matrix/mainline"

echo "build-matrix: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
