#!/usr/bin/env bash
# Build and run the micro-benchmarks; results to bench/results/DATE-micro.*
#   bench/micro/run.sh [extra Google Benchmark flags, e.g. --benchmark_filter=Ring]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${ESI_MICRO_BUILD:-$root/build-bench/micro}
results=$root/bench/results
stamp=$(date +%Y-%m-%d)

# ESI_SOURCE_DIR: the tree whose parser and ring are measured (run.sh --rev
# points it at the snapshot it built).
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DESI_SOURCE_DIR="${ESI_SOURCE_DIR:-$root}" >/dev/null
cmake --build "$build" -j"${ESI_JOBS:-2}" >/dev/null
mkdir -p "$results"
out=$results/$stamp-micro
{
    echo "# micro-benchmarks, $(date '+%Y-%m-%d %H:%M')"
    echo "# $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n1)," \
         "Linux $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
         "source ${ESI_SOURCE_DIR:-$root} ($(cd "$root" && git describe --always --dirty))"
} >"$out.txt"
for b in esi_parser_bench esi_plan_bench esi_ring_bench; do
    "$build/$b" --benchmark_min_time=0.2 --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true \
        --benchmark_out="$out-$b.json" --benchmark_out_format=json "$@" \
        2>&1 | tee -a "$out.txt"
done
echo "micro: results in $out.txt"
