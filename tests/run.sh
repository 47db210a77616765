#!/usr/bin/env bash
# The whole gate: dependencies, a RelWithDebInfo build (esid, the module)
# and its integration tests, then an ASan+UBSan build of esid, the unit
# tests, nginx and the module, and every ctest test; then fuzzing, the bench
# smoke, static checks, the build matrix (every NGINX version), the whole
# integration suite again on mainline NGINX, and the packages.  Ends with
# one line "N passed, N failed, N skipped"; exits non-zero on any failure.
#
# What is counted (tests/README.md, "What the gate counts"): each unit test
# (one ctest test per gtest), each integration test *method* (not each
# file: tests/gate_count.py reads what integration/run_counted.py wrote),
# each fuzz target, each entry of the scripts below.  A skip counts as
# skipped only when tests/expected-skips lists it, else as failed.
#
#   tests/run.sh                              # the gate
#   tests/run.sh --ctest-only BUILD_DIR [CTEST ARGS...]
#       # only the counted ctest step, on a tree already built, e.g.
#       # tests/run.sh --ctest-only build -R 'integration.test_(esid|parallel)'
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${ESI_JOBS:-2}
logs=$(mktemp -d /tmp/esi-run.XXXXXX)
passed=0
failed=0
skipped=0
: >"$logs/skips"
: >"$logs/failures"

# Each step's header carries the seconds since the start, so a slow CI log
# shows where its time went.
step() { printf '\n==== [%ds] %s\n' "$SECONDS" "$*"; }

# Adds the counts of a "NAME: N passed, N failed[, N skipped]" line.
add_counts() {
    local line=$1
    passed=$((passed + $(sed -E 's/^[^:]*: ([0-9]+) passed.*/\1/' <<<"$line")))
    failed=$((failed + $(sed -E 's/^[^:]*: [0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")))
    if [[ $line =~ ([0-9]+)\ skipped$ ]]; then
        skipped=$((skipped + BASH_REMATCH[1]))
    fi
}

# Takes the last "NAME: N passed, N failed[, N skipped]" line of LOG into
# the counts, and its "NAME: FAILED what" and "NAME: skipped what" lines
# into the summary; a LOG without that line is one failure.
take_summary() {
    local name=$1 log=$2
    local line
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?\$" \
           "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "run: $name ended without its summary"
        echo "$name: no summary" >>"$logs/failures"
        failed=$((failed + 1))
        return 1
    fi
    add_counts "$line"
    grep -E "^$name: skipped " "$log" >>"$logs/skips"
    grep -E "^$name: FAILED " "$log" | sed "s/^$name: FAILED /$name: /" \
        >>"$logs/failures"
    return 0
}

# Runs a script whose last summary line is "NAME: N passed, N failed"
# (optionally ", N skipped") and adds its counts; a script that ends
# without one is one failure.
counted() {
    local name=$1; shift
    local log="$logs/$name.log"
    "$@" 2>&1 | tee "$log"
    take_summary "$name" "$log"
}

# Runs ctest in a built tree and counts each unit test and each
# integration test method (tests/gate_count.py) under the tree's name, or
# GATE_NAME; adds to the counts.
ctest_counted() {
    local dir=$1; shift
    local name=${GATE_NAME:-$(basename "$dir")}
    local log="$logs/$name.ctest.log" junit="$logs/$name.junit.xml"
    local results="$logs/$name.results"
    rm -rf "$results" "$junit"
    mkdir -p "$results"
    step "ctest $dir $*"
    ESI_RESULTS_DIR=$results ctest --test-dir "$dir" --output-on-failure \
        -j"$jobs" --output-junit "$junit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local before=$failed
    python3 tests/gate_count.py --name "$name" --junit "$junit" \
        --results "$results" >"$log.count" 2>&1
    cat "$log.count"
    take_summary "$name" "$log.count" || return
    if [ "$rc" -ne 0 ] && [ "$failed" -eq "$before" ]; then
        echo "run: ctest in $dir exited $rc"
        echo "$name: ctest exited $rc" >>"$logs/failures"
        failed=$((failed + 1))
    fi
}

# The last lines: the skips with their reasons, what failed, the counts.
summary() {
    echo
    echo "run: took ${SECONDS}s"
    if [ -s "$logs/skips" ]; then
        echo "run: $skipped skipped (expected: tests/expected-skips):"
        sed 's/^/  /' "$logs/skips"
    fi
    if [ -s "$logs/failures" ]; then
        echo "run: failed:"
        sed 's/^/  /' "$logs/failures"
    fi
    rm -rf "$logs"
    echo "$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
}

if [ "${1:-}" = --ctest-only ]; then
    if [ $# -lt 2 ]; then
        echo "usage: $0 --ctest-only BUILD_DIR [CTEST ARGS...]" >&2
        exit 2
    fi
    shift
    ctest_counted "$@"
    summary
    exit
fi

# Configure, build and test one build tree; adds to the counts.
suite() {
    local dir=$1; shift
    step "configure $dir $*"
    if ! cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; then
        echo "run: configure of $dir failed"
        echo "$dir: configure" >>"$logs/failures"
        failed=$((failed + 1))
        return
    fi
    step "build $dir"
    if ! cmake --build "$dir" -j"$jobs"; then
        echo "run: build of $dir failed"
        echo "$dir: build" >>"$logs/failures"
        failed=$((failed + 1))
        return
    fi
    ctest_counted "$dir"
}

step "dependencies"
if ! bash packaging/deps.sh; then
    echo "run: packaging/deps.sh failed"
    echo "dependencies: packaging/deps.sh" >>"$logs/failures"
    failed=$((failed + 1))
fi

# The unit tests are built and run once, in the sanitized build below.  Not
# a unity build: the static checks read its compile_commands.json.
suite build -DESI_UNIT_TESTS=OFF -DCMAKE_UNITY_BUILD=OFF

# The .debs (and lintian) build in the background at the lowest priority,
# on what the steps below leave idle (integration tests mostly wait on
# sockets, fuzzing and lintian use one core); the packages step waits for
# them.  CI's 30 minutes need that overlap.  The folder is emptied first
# (build-deb.sh empties it too): packages of an earlier run must not stand
# in for a build that failed.
rm -rf "$root/build-packages/deb"
(DEB_BUILD_OPTIONS="nocheck noautodbgsym" nice -n 19 \
    bash packaging/build-deb.sh "$root/build-packages/deb" \
    >"$logs/build-deb.log" 2>&1
 echo $? >"$logs/build-deb.rc") &
debs=$!

# Everything under AddressSanitizer and UBSan: esid and the unit tests, and
# for the integration tests an nginx built from Debian's source (apt-get
# source, once per build-asan tree) with the module built into its tree, both
# sanitized; a sanitizer report of nginx fails the test (tests/README.md).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
suite build-asan -DESI_SANITIZE=ON

# libFuzzer targets (tests/fuzz/README.md): a clang build of the fuzz
# targets only, then each target for a bounded time on a scratch copy of its
# seed corpus; each target is one pass or one fail, and so is a target the
# build lists (build-fuzz/fuzz-targets, CMake's ESI_FUZZ_TARGETS) with no
# folder in tests/fuzz/corpus, or a folder there no target of the build has.
step "fuzz"
rm -f build-fuzz/fuzz-targets
if CC=clang CXX=clang++ cmake -S "$root" -B build-fuzz \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DESI_FUZZ=ON \
        >"$logs/fuzz-build.log" 2>&1 &&
   cmake --build build-fuzz -j"$jobs" --target fuzz >>"$logs/fuzz-build.log" 2>&1
then
    counted fuzz bash tests/fuzz/fuzz.sh build-fuzz all "${ESI_FUZZ_SECONDS:-5}"
else
    tail -n 40 "$logs/fuzz-build.log"
    echo "run: fuzz build failed"
    # One failure a target, as many as there are corpus folders.
    for t in $(ls tests/fuzz/corpus); do
        echo "fuzz: $t (the fuzz build failed)" >>"$logs/failures"
        failed=$((failed + 1))
    done
fi

# Benchmark smoke (bench/README.md): every benchmark target (origin,
# Varnish, nginx + module + esid, nginx SSI, nginx without ESI) started on
# the build above and checked to answer the expected bytes; no timing.
step "bench smoke"
if bash bench/run.sh --smoke --build-dir build >"$logs/bench-smoke.log" 2>&1
then
    passed=$((passed + 1))
else
    tail -n 40 "$logs/bench-smoke.log"
    echo "run: bench smoke failed"
    echo "bench smoke" >>"$logs/failures"
    failed=$((failed + 1))
fi

# Static checks (tests/README.md): cppcheck and clang-tidy over the build
# above, zero findings; each tool is one pass or one fail.
step "static checks"
counted static-checks bash tests/static-checks.sh build

# Build matrix (tests/README.md): the connector against Debian's nginx
# source without the gzip module, without zlib, and compiled in statically,
# and against every NGINX source tarball shared with the project, dynamic
# and static, with a smoke run on each; each variant's build and each of its
# test methods is one pass or one fail.
step "build matrix"
counted build-matrix bash tests/build-matrix.sh build

# The whole integration suite again, on the newest of those NGINX (built by
# the matrix with nginx.org's package arguments, HTTP/3 among them), with
# the plain build's esid (tests/README.md, "NGINX versions").
step "mainline suite"
mainline=$root/build/matrix/mainline
if [ -x "$mainline/nginx" ] && [ -f "$mainline/ngx_http_esi_module.so" ]; then
    ESI_NGINX=$mainline/nginx ESI_MODULE=$mainline/ngx_http_esi_module.so \
        ESI_EXPECT_HTTP3=1 GATE_NAME=mainline \
        ctest_counted build -L integration
else
    echo "run: the build matrix left no mainline nginx in $mainline"
    echo "mainline: no nginx built" >>"$logs/failures"
    failed=$((failed + 1))
fi

# The packages (packaging/ci-packages.sh): the .debs (lintian-clean of
# errors) built from this tree and the RPM spec parsed (building the RPMs
# too would take CI past its 30 minutes); the .debs installed, esid
# socket-activated, Debian's nginx with the installed module serving an
# assembled page, esid reloaded and restarted under wrk load (every body
# checked), esictl checked, a page's Vary variants purged after an esid
# restart with esid as user esid and the workers as www-data, control_group
# tried; then everything purged.  Each of its checks is one pass or one fail.
step "packages"
wait "$debs"
if [ "$(cat "$logs/build-deb.rc")" = 0 ]; then
    passed=$((passed + 1))
    sed -n '/^build-deb: lintian/,$p' "$logs/build-deb.log"
    echo "run: dpkg-buildpackage built the .debs, lintian reports no error"
else
    tail -n 40 "$logs/build-deb.log"
    echo "run: the .debs did not build, or lintian reports an error"
    echo "packages: the .debs did not build" >>"$logs/failures"
    failed=$((failed + 1))
fi
ESI_PACKAGES_PREBUILT=1 ESI_PACKAGES_RPM=spec counted packages \
    bash packaging/ci-packages.sh "$root/build-packages"

summary
