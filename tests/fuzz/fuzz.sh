#!/usr/bin/env bash
# Runs one fuzz target for a bounded time on a scratch copy of its seed
# corpus, as CI does (tests/run.sh).  Exits non-zero on a crash, a leak, a
# timeout or a broken promise, after printing the end of libFuzzer's log;
# the input that did it is kept in BUILD_DIR/fuzz-artifacts/TARGET/.
#
#   tests/fuzz/fuzz.sh BUILD_DIR TARGET SECONDS [libFuzzer flags...]
set -uo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 BUILD_DIR TARGET SECONDS [libFuzzer flags...]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$1 target=$2 seconds=$3
shift 3

work=$(mktemp -d /tmp/esi-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$here/corpus/$target" "$work/corpus"
mkdir "$work/artifacts"

# Reported findings do not stop the run (known-findings says which).
ESI_FUZZ_TOLERATE=$(sed -e 's/#.*//' "$here/known-findings" |
                    awk 'NF { print $1 }' | paste -sd, -)
export ESI_FUZZ_TOLERATE

"$build/$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" \
    "$work/corpus" >"$work/log" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
grep -h 'known finding' "$work/log" | sed "s/^/fuzz: $target: /"
if [ "$rc" -eq 0 ]; then
    echo "fuzz: $target: ${runs:-?} runs in ${seconds}s (${speed:-?}/s), no crash"
    exit 0
fi

tail -n 60 "$work/log"
mkdir -p "$build/fuzz-artifacts/$target"
cp "$work"/artifacts/* "$build/fuzz-artifacts/$target/" 2>/dev/null
echo "fuzz: $target: FAILED (exit $rc) after ${runs:-?} runs; input kept in" \
     "$build/fuzz-artifacts/$target/"
exit 1
