#!/usr/bin/env bash
# Debian's nginx for the sanitized build (ESI_SANITIZE=ON): its source,
# configured with the flags of the packaged /usr/sbin/nginx, to be built with
# ASan and UBSan together with our module.  nginx-connector/CMakeLists.txt
# runs this; tests/README.md says why.
#
#   nginx.sh fetch DIR [SRC]
#       DIR/src: a copy of the nginx source tree SRC or, without SRC, the
#       source of Debian's nginx package (apt-get source: Debian's patches
#       applied), the installed version when the archive still has it.
#   nginx.sh configure DIR MODULE CC_OPT LD_OPT
#       DIR/tree: a copy of DIR/src configured as the packaged nginx is
#       (`nginx -V`, less the =dynamic modules, whose libraries we do not
#       install), with MODULE as a dynamic module and CC_OPT, LD_OPT.
set -euo pipefail

packaged_nginx=/usr/sbin/nginx

fetch() {
    local dir=$1 src=${2:-}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    rm -rf "$dir/src" "$dir/download"
    if [ -n "$src" ]; then
        cp -a "$src" "$dir/src"
        return
    fi

    local apt=()
    if [ -z "$(apt-cache showsrc nginx 2>/dev/null)" ]; then
        apt=($(private_deb_src "$dir/apt"))
    fi
    local versions v
    versions=$({ dpkg-query -W -f='${Version}\n' nginx 2>/dev/null || true
                 apt-cache "${apt[@]}" showsrc nginx |
                     sed -n 's/^Version: //p' | sort -rV; } | awk '!seen[$0]++')
    mkdir "$dir/download"
    for v in $versions; do
        if (cd "$dir/download" &&
            apt-get "${apt[@]}" source -q "nginx=$v" >apt.log 2>&1); then
            mv "$dir/download"/nginx-*/ "$dir/src"
            rm -rf "$dir/download" "$dir/apt"
            echo "nginx.sh: Debian's nginx $v source in $dir/src"
            return
        fi
        # The archive dropped this version: try the next one.
        find "$dir/download" -mindepth 1 ! -name apt.log -delete
    done
    echo "nginx.sh: apt-get source nginx failed for every version" \
         "(${versions//$'\n'/ }):" >&2
    cat "$dir/download/apt.log" >&2 || true
    exit 1
}

# No deb-src line is configured (as on a fresh Debian 12): an APT state of
# our own under DIR whose sources are the system's, as deb-src.  Prints the
# apt-get options that select it.
private_deb_src() {
    local dir=$1 f
    rm -rf "$dir"
    mkdir -p "$dir/sources.list.d" "$dir/lists/partial" "$dir/cache"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -n 's/^deb \(.*\)/deb-src \1/p' "$f"
    done >"$dir/sources.list"
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed 's/^Types:.*/Types: deb-src/' "$f" \
            >"$dir/sources.list.d/$(basename "$f")"
    done
    local opts=(-o "Dir::Etc::SourceList=$dir/sources.list"
                -o "Dir::Etc::SourceParts=$dir/sources.list.d"
                -o "Dir::State::Lists=$dir/lists"
                -o "Dir::Cache=$dir/cache"
                -o "APT::Sandbox::User=root")
    # A third-party source without deb-src fails here; Debian's are enough.
    apt-get "${opts[@]}" update -q >&2 || true
    echo "${opts[@]}"
}

# The packaged nginx's configure arguments, one a line, without its
# compiler and linker options and without the =dynamic modules.
packaged_flags() {
    "$packaged_nginx" -V 2>&1 | python3 -c '
import shlex, sys
for line in sys.stdin:
    if line.startswith("configure arguments:"):
        for arg in shlex.split(line.split(":", 1)[1]):
            if not arg.startswith(("--with-cc-opt=", "--with-ld-opt=")) \
                    and not arg.endswith("=dynamic"):
                print(arg)
        break
else:
    sys.exit("no configure arguments in nginx -V")
'
}

configure() {
    local dir=$1 module=$2 cc_opt=$3 ld_opt=$4
    local flags
    flags=$(packaged_flags)
    mapfile -t flags <<<"$flags"
    rm -rf "$dir/tree"
    cp -a "$dir/src" "$dir/tree"
    cd "$dir/tree"
    if ! ./configure "${flags[@]}" --add-dynamic-module="$module" \
            --with-cc-opt="$cc_opt" --with-ld-opt="$ld_opt" >configure.log 2>&1
    then
        tail -n 30 configure.log >&2
        exit 1
    fi
}

case ${1:-} in
    fetch) shift; fetch "$@" ;;
    configure) shift; configure "$@" ;;
    *) echo "usage: $0 fetch DIR [SRC] | configure DIR MODULE CC_OPT LD_OPT" >&2
       exit 2 ;;
esac
