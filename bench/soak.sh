#!/usr/bin/env bash
# The soak (issue #23, item 5), one command:
#
#   bench/soak.sh [--duration 10m | 1h | SECONDS] [--build-dir DIR]
#                 [soak.py's options: --rate, --clients, --restart-every,
#                  --warmup, --interval, --keep]
#
# Mixed traffic (pages, fragments, exact and tag purges, an esid restart
# every 4 minutes) against NGINX + the module + esid built in DIR (default
# build/), sampling every worker's and esid's memory and fds, esid's ring
# counters and the plan zone's bytes every 10 s into
# bench/results/DATE-soak.{csv,png}; at the end the growth after warm-up
# (least squares, % an hour), goal under 1%.  See bench/README.md, Soak.
set -euo pipefail

cd "$(dirname "$0")/.."
build_dir=build
duration=600
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --duration) duration=$2; shift 2 ;;
        --build-dir) build_dir=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done
case $duration in
    *h) duration=$(( ${duration%h} * 3600 )) ;;
    *m) duration=$(( ${duration%m} * 60 )) ;;
    *s) duration=${duration%s} ;;
esac
for f in esid esictl ngx_http_esi_module.so; do
    [ -e "$build_dir/$f" ] || { echo "soak: $build_dir/$f missing (build the project first)" >&2; exit 1; }
done
command -v gnuplot >/dev/null || echo "soak: gnuplot missing (apt-get install gnuplot-nox): no plot" >&2
exec python3 bench/soak.py --build-dir "$build_dir" --duration "$duration" ${args[@]+"${args[@]}"}
