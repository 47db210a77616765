#!/usr/bin/env bash
# The benchmark suite, one command:
#
#   bench/run.sh [--smoke | --short | --full | --purge [--full-purge] | --fleet
#                 | --purge-peers [--sizes 10k] | --purge-peers-smoke]
#                [--build-dir DIR] [--micro]
#
#   --smoke   start every target and check each answers the expected bytes,
#             and one purge each way on a 1k-file zone, and the fleet's
#             smoke (10 purges and 1 s at 1,000/s, each reaching all three
#             nodes); no timing (well under a minute; this is what CI runs)
#   --short   a quick look: 4 rows of the Varnish matrix (default)
#   --full    the record: the whole Varnish matrix and the ESI-cost matrix
#   --purge   the purge benchmark (bench/purge.py): zones of 10k and 100k
#             cache files, purge by zone scan, by esid's index and by
#             ngx_cache_purge 2.3, warm and cold page cache
#   --full-purge  the same, then a 1M-file zone on its own (implies --purge)
#   --purge-peers our purge against ngx_cache_purge 3.0.1 and
#             ngx_cache_pilot 2.0.0 (bench/purge_peers.py; built by
#             bench/build-peers.sh from ../shared/peers, or --peers-src DIR):
#             zones of 10k, 100k and 1M files, every kind of purge each
#             target has, a storm of 1,000/s, memory, restart
#   --purge-peers-smoke  the same on a 1k-file zone, one purge a row, no
#             timing (~10 s once the peers are built)
#   --fleet   the fleet benchmark (bench/fleet.py): Redis and three NGINX +
#             esid nodes; fan-out latency of 1,000 purges and a 10 s run at
#             1,000 purges/s with each node's lag, Redis' memory and cost
#   --rev REV build and measure commit REV (a clean `git archive` of it, in
#             build-bench/rev-SHA/) rather than the work tree
#   --build-dir DIR   use the esid and module already built in DIR instead of
#             building the project (Release) into build-bench/
#   --micro   also build and run the Google Benchmark micro-benchmarks
#             (bench/micro/)
#
# Installs what it needs from Debian (wrk, varnish, the echo module, gnuplot,
# python3), builds the project, then hands over to bench/bench.py, which
# starts the origin, Varnish, NGINX + module + esid, NGINX SSI and NGINX with
# ESI off on 127.0.0.1, verifies their output byte for byte and times them;
# or, with --purge, to bench/purge.py (and the cache purge module, e2fsprogs),
# with --purge-peers to bench/build-peers.sh and bench/purge_peers.py (and
# nginx-dev), with --fleet to bench/fleet.py (and redis-server).
# Results land in bench/results/; see bench/README.md for the method.
#
# Everything started here is stopped on exit, also on failure or ^C.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
mode=short
build_dir=
rev=
micro=
sizes=10k,100k
peers_src=$root/../shared/peers
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --smoke|--short|--full|--purge|--fleet) mode=${1#--}; shift ;;
        --full-purge) mode=purge; sizes=10k,100k+1m; shift ;;
        --build-dir) build_dir=$2; shift 2 ;;
        --rev) rev=$2; shift 2 ;;
        --micro) micro=1; shift ;;
        --purge-peers) mode=peers; shift ;;
        --purge-peers-smoke) mode=peers; args+=(--smoke); shift ;;
        --peers-src) peers_src=$2; shift 2 ;;
        -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done

log() { printf 'bench: %s\n' "$*"; }

# -- dependencies ------------------------------------------------------------

if [ "$mode" = purge ] || [ "$mode" = peers ]; then
    packages=(nginx python3 e2fsprogs mount)
elif [ "$mode" = fleet ]; then
    packages=(nginx python3 redis-server)
else
    packages=(wrk varnish libnginx-mod-http-echo nginx python3 curl)
fi
# ngx_cache_purge 2.3, the purge benchmark's comparison (and its smoke's).
case $mode in smoke|purge) packages+=(libnginx-mod-http-cache-purge) ;; esac
case $mode in smoke) packages+=(redis-server) ;; esac
case $mode in smoke|fleet|peers) ;; *) packages+=(gnuplot-nox) ;; esac
# The peers are built against Debian's nginx-dev tree, as ours is.
case $mode in
    peers) packages+=(nginx-dev gcc make libpcre2-dev libssl-dev zlib1g-dev) ;;
esac
[ -z "$micro" ] || packages+=(libbenchmark-dev)
if [ -z "$build_dir" ]; then
    # The project's own build dependencies (quick when all are present).
    bash packaging/deps.sh >/dev/null
fi
missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bench: missing ${missing[*]}; run as root" >&2
        exit 1
    fi
    log "installing ${missing[*]}"
    # Keep maintainer scripts from starting the system varnish or nginx:
    # every target here is started by hand on a port of its own.
    policy=/usr/sbin/policy-rc.d
    own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    rc=0
    { apt-get update -q && apt-get install -y -q --no-install-recommends \
        "${missing[@]}" </dev/null; } || rc=$?
    [ -z "$own_policy" ] || rm -f "$policy"
    [ "$rc" -eq 0 ] || { echo "bench: apt-get failed ($rc)" >&2; exit "$rc"; }
fi

# -- build ---------------------------------------------------------------------

# What is measured: the work tree, or a clean snapshot of one commit.
if [ -n "$build_dir" ]; then
    product="prebuilt in $build_dir ($(git describe --always --dirty))"
elif [ -n "$rev" ]; then
    sha=$(git rev-parse --short "$rev^{commit}")
    src=$root/build-bench/rev-$sha/src
    build_dir=$root/build-bench/rev-$sha/build
    if [ ! -f "$src/CMakeLists.txt" ]; then
        mkdir -p "$src"
        git archive "$sha" | tar -x -C "$src"
    fi
    product="commit $sha"
else
    src=$root
    build_dir=$root/build-bench
    product="work tree at $(git describe --always --dirty)"
fi
if [ -n "${src:-}" ]; then
    log "building the project (Release) from $src in $build_dir"
    cmake -S "$src" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build_dir" -j"${ESI_JOBS:-2}" --target esid esictl \
        ngx_http_esi_module >/dev/null
fi
build_dir=$(cd "$build_dir" && pwd)
for f in esid ngx_http_esi_module.so; do
    [ -e "$build_dir/$f" ] || { echo "bench: $build_dir/$f missing" >&2; exit 1; }
done

# -- run -------------------------------------------------------------------------

# bench.py stops everything it started itself (try/finally and signal
# handlers); this trap is the backstop should python die hard.
pid=
stop() {
    local rc=$?
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    exit "$rc"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

run_py() {
    python3 "$@" &
    pid=$!
    local rc=0
    wait "$pid" || rc=$?
    pid=
    return "$rc"
}

rc=0
if [ "$mode" = purge ]; then
    run_py "$root/bench/purge.py" --sizes "$sizes" --build-dir "$build_dir" \
        --product "$product" ${args[@]+"${args[@]}"} || rc=$?
elif [ "$mode" = peers ]; then
    log "building the NGINX purge modules from $peers_src"
    bash "$root/bench/build-peers.sh" "$peers_src" "$build_dir/peers" >/dev/null
    run_py "$root/bench/purge_peers.py" --build-dir "$build_dir" \
        --peers "$build_dir/peers" --product "$product" \
        ${args[@]+"${args[@]}"} || rc=$?
elif [ "$mode" = fleet ]; then
    run_py "$root/bench/fleet.py" --build-dir "$build_dir" \
        --product "$product" ${args[@]+"${args[@]}"} || rc=$?
else
    run_py "$root/bench/bench.py" --mode "$mode" --build-dir "$build_dir" \
        --product "$product" ${args[@]+"${args[@]}"} || rc=$?
    if [ "$rc" -eq 0 ] && [ "$mode" = smoke ]; then
        run_py "$root/bench/purge.py" --smoke --build-dir "$build_dir" \
            --product "$product" || rc=$?
    fi
    if [ "$rc" -eq 0 ] && [ "$mode" = smoke ]; then
        # ~3 s: 10 purges and 1 s at 1,000/s over Redis and three nodes.
        run_py "$root/bench/fleet.py" --smoke --build-dir "$build_dir" \
            --product "$product" || rc=$?
    fi
fi

if [ "$rc" -eq 0 ] && [ -n "$micro" ]; then
    ESI_SOURCE_DIR=${src:-$root} bash "$root/bench/micro/run.sh" || rc=$?
fi
exit "$rc"
