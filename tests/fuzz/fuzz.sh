#!/usr/bin/env bash
# Runs one fuzz target for a bounded time on a scratch copy of its seed
# corpus, as CI does (tests/run.sh).  Exits non-zero on a crash, a leak, a
# timeout or a broken promise, after printing the end of libFuzzer's log
# (the input that did it is kept in BUILD_DIR/fuzz-artifacts/TARGET/); and
# when TARGET has no corpus folder, or libFuzzer ends without having
# executed a single input (its final stats say 0 runs, or nothing).
#
#   tests/fuzz/fuzz.sh BUILD_DIR TARGET SECONDS [libFuzzer flags...]
#   tests/fuzz/fuzz.sh BUILD_DIR all SECONDS [libFuzzer flags...]
#
# "all" (tests/run.sh's step "fuzz") runs every target the build lists in
# BUILD_DIR/fuzz-targets (CMake's ESI_FUZZ_TARGETS), and fails a target
# without a corpus folder and a corpus folder no target of the build has;
# it ends with "fuzz: N passed, N failed", one entry each.
set -uo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 BUILD_DIR TARGET|all SECONDS [libFuzzer flags...]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$1 target=$2 seconds=$3
shift 3

if [ "$target" = all ]; then
    passed=0 failed=0
    if [ ! -s "$build/fuzz-targets" ]; then
        echo "fuzz: FAILED: no list of targets in $build/fuzz-targets"
        echo "fuzz: 0 passed, 1 failed"
        exit 1
    fi
    for c in $(ls "$here/corpus"); do
        if ! grep -qx "$c" "$build/fuzz-targets"; then
            echo "fuzz: FAILED corpus/$c: no fuzz target of the build has it"
            failed=$((failed + 1))
        fi
    done
    for t in $(cat "$build/fuzz-targets"); do
        if bash "$0" "$build" "$t" "$seconds" "$@"; then
            passed=$((passed + 1))
        else
            echo "fuzz: FAILED $t"
            failed=$((failed + 1))
        fi
    done
    echo "fuzz: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

if [ ! -d "$here/corpus/$target" ]; then
    echo "fuzz: $target: FAILED: no corpus folder $here/corpus/$target"
    exit 1
fi
work=$(mktemp -d /tmp/esi-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$here/corpus/$target" "$work/corpus"
mkdir "$work/artifacts"

"$build/$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" \
    "$work/corpus" >"$work/log" 2>&1
rc=$?

# -print_final_stats=1 ends the log with "stat::number_of_executed_units: N";
# "Done N runs in S second(s)" is libFuzzer's own last line of a run.
runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' \
       "$work/log" | tail -n 1)
done_runs=$(sed -n 's/^Done \([0-9]*\) runs in .*/\1/p' "$work/log" | tail -n 1)
speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
if [ "$rc" -eq 0 ] && [ "${runs:-0}" -eq 0 ] && [ "${done_runs:-0}" -eq 0 ]; then
    tail -n 60 "$work/log"
    echo "fuzz: $target: FAILED: libFuzzer executed no input" \
         "(stat::number_of_executed_units: ${runs:-none}," \
         "Done: ${done_runs:-none})"
    exit 1
fi
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
