#!/usr/bin/env bash
# ngx_http_esi_module for one NGINX: its source tree (or tarball) configured
# with the module, the module built with -Werror.  An NGINX loads a dynamic
# module built from the same version's source with the same --with-compat
# signature (or, without --with-compat, the same configure arguments); any
# other one it refuses at load_module (docs/install.md).
#
#   packaging/build-module.sh [OPTIONS] SOURCE [-- CONFIGURE ARGS...]
#
#   SOURCE            an NGINX source tree or its .tar.gz: nginx.org's
#                     release tarball (./configure) or a git archive of a
#                     release tag (auto/configure)
#   --nginx BIN       build for that installed nginx: its version must be
#                     SOURCE's, and the module takes --with-compat and the
#                     arguments its code depends on (SSL, gzip, gunzip:
#                     OpenSSL's headers are needed when BIN has SSL) when
#                     BIN was built with it, else all of BIN's configure
#                     arguments (nginx -V)
#   --args-file FILE  configure arguments, one a line (# comments), e.g.
#                     packaging/nginx.org-configure-args
#   --static          compile the module into an nginx binary (--add-module)
#   --binary          build the nginx binary too (tests, the demo)
#   --out DIR         where the tree is built and the results are put
#                     (default: build-module/nginx-VERSION[-static])
#   --build-dir DIR   the project's CMake build tree, for the wire layout
#                     header generated from proto/esi.capnp (default:
#                     build; configured and that header generated if missing)
#   --cc-opt OPTS     more compiler options
#
# Without --nginx, --args-file or CONFIGURE ARGS, --with-compat alone: the
# module then loads into any nginx of that version built with --with-compat
# (nginx.org's, Ubuntu's and Debian's packages are).  Arguments a version
# does not know (--with-http_v3_module before 1.25) are left out, with a
# note.  The tree is configured again only when the arguments change; make
# rebuilds what changed.  Prints the paths of what it built, last.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

usage() {
    sed -n '/^#   packaging/,/^# rebuilds/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() { echo "build-module: $*" >&2; exit 1; }

source= nginx_bin= args_file= static= binary= out= cc_opt=
build_dir=$root/build
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --nginx) nginx_bin=${2:?}; shift 2 ;;
        --args-file) args_file=$(realpath "${2:?}"); shift 2 ;;
        --static) static=1; shift ;;
        --binary) binary=1; shift ;;
        --out) out=$(realpath -m "${2:?}"); shift 2 ;;
        --build-dir) build_dir=$(realpath -m "${2:?}"); shift 2 ;;
        --cc-opt) cc_opt=${2:?}; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) usage ;;
        -*) echo "build-module: unknown option $1" >&2; usage ;;
        *) [ -z "$source" ] || usage; source=$(realpath "$1"); shift ;;
    esac
done
[ -n "$source" ] || usage
[ -e "$source" ] || die "no NGINX source at $source"

# The source's version, from the tree or the tarball's src/core/nginx.h.
if [ -d "$source" ]; then
    version_h=$(cat "$source/src/core/nginx.h" 2>/dev/null) ||
        die "$source is not an NGINX source tree (no src/core/nginx.h)"
else
    member=$(tar tzf "$source" | awk '/^[^\/]+\/src\/core\/nginx\.h$/')
    [ -n "$member" ] ||
        die "$source is not an NGINX source tarball (no src/core/nginx.h)"
    version_h=$(tar xzOf "$source" "$member")
fi
version=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' <<<"$version_h")
[ -n "$version" ] || die "no NGINX_VERSION in $source's src/core/nginx.h"

# The configure arguments.
args=()
if [ -n "$nginx_bin" ]; then
    said=$("$nginx_bin" -V 2>&1) || die "$nginx_bin -V failed"
    bin_version=$(sed -n 's|^nginx version: [^/]*/\([0-9.]*\).*|\1|p' <<<"$said")
    [ "$bin_version" = "$version" ] ||
        die "$nginx_bin is nginx $bin_version, the source is $version:" \
            "NGINX loads only modules built from its own version's source"
    mapfile -t bin_args < <(python3 -c '
import shlex, sys
for line in sys.stdin:
    if line.startswith("configure arguments:"):
        for arg in shlex.split(line.split(":", 1)[1]):
            if not arg.startswith(("--with-cc-opt=", "--with-ld-opt=")) \
                    and not arg.endswith("=dynamic") \
                    and not arg.startswith("--add-dynamic-module="):
                print(arg)
' <<<"$said")
    if printf '%s\n' "${bin_args[@]}" | grep -qx -- --with-compat; then
        # --with-compat makes the structures match; the module's own code
        # still depends on these (NGX_HTTP_SSL: proxy_pass https's default
        # cache key; NGX_HTTP_GZIP, NGX_ZLIB: inflating and stitching).
        args+=(--with-compat)
        for arg in "${bin_args[@]}"; do
            case $arg in
                --with-http_ssl_module|--without-http_gzip_module|\
                --with-http_gunzip_module|--with-http_gzip_static_module)
                    args+=("$arg") ;;
            esac
        done
    else
        args+=("${bin_args[@]}")
    fi
fi
if [ -n "$args_file" ]; then
    mapfile -t file_args < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' \
                             -e 's/^[[:space:]]*//;s/[[:space:]]*$//' \
                             "$args_file")
    args+=("${file_args[@]}")
fi
args+=("${extra[@]}")
[ ${#args[@]} -gt 0 ] || args=(--with-compat)

[ -n "$out" ] || out=$root/build-module/nginx-$version${static:+-static}
tree=$out/tree
mkdir -p "$out"

# The wire layout header the connector includes, generated by CMake.
layout=$build_dir/proto/c/esi_wire_layout.h
if [ ! -f "$layout" ]; then
    [ -f "$build_dir/CMakeCache.txt" ] ||
        cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log" >&2; exit 1; }
    cmake --build "$build_dir" --target esi_wire_layout_gen \
        >>"$out/cmake.log" 2>&1 || { cat "$out/cmake.log" >&2; exit 1; }
fi

if [ -n "$static" ]; then
    link=--add-module=$root/nginx-connector
else
    link=--add-dynamic-module=$root/nginx-connector
fi
opt="-Wall -Werror -I$root/include -I$build_dir/proto/c${cc_opt:+ $cc_opt}"
stamp=$(printf '%s\n' "$source" "${args[@]}" "$link" "$opt" |
        cat - "$root/nginx-connector/config" "$0" | sha256sum | cut -d' ' -f1)

if [ ! -f "$out/configured" ] || [ "$(cat "$out/configured")" != "$stamp" ]
then
    rm -rf "$tree" "$out/configured"
    mkdir -p "$tree"
    if [ -d "$source" ]; then
        cp -a "$source/." "$tree"
    else
        tar xzf "$source" -C "$tree" --strip-components=1
    fi
    configure=./configure
    [ -x "$tree/configure" ] || configure=./auto/configure

    # Arguments this version has no option for are left out.
    known=()
    for arg in "${args[@]}"; do
        name=${arg%%=*}
        if grep -qE -- "^ *${name}(=\\*)?\\)" "$tree/auto/options"; then
            known+=("$arg")
        else
            echo "build-module: nginx $version has no $name; left out"
        fi
    done

    echo "build-module: configuring nginx $version:" "${known[@]}" "$link"
    if ! (cd "$tree" && "$configure" "${known[@]}" "$link" \
            --with-cc-opt="$opt") >"$out/configure.log" 2>&1; then
        tail -n 30 "$out/configure.log" >&2
        die "configure of nginx $version failed ($out/configure.log)"
    fi
    echo "$stamp" >"$out/configured"
fi

if [ -n "$static" ] || [ -n "$binary" ]; then
    targets=(build)
else
    targets=(modules)
fi
# Each connector object again: make knows only the module's config deps.
rm -f "$tree"/objs/addon/nginx-connector/*.o
if ! make -C "$tree" -f objs/Makefile -j"${ESI_JOBS:-2}" "${targets[@]}" \
        >"$out/make.log" 2>&1; then
    grep -E 'error|Error' "$out/make.log" | head -n 30 >&2
    die "make of nginx $version failed ($out/make.log)"
fi

if [ -n "$static" ] || [ -n "$binary" ]; then
    cp "$tree/objs/nginx" "$out/nginx"
    echo "build-module: $out/nginx"
fi
if [ -z "$static" ]; then
    cp "$tree/objs/ngx_http_esi_module.so" "$out/ngx_http_esi_module.so"
    echo "build-module: $out/ngx_http_esi_module.so (nginx $version)"
fi
