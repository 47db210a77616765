#!/usr/bin/env bash
# The whole gate: dependencies, a RelWithDebInfo build (esid, the module)
# and its integration tests, then an ASan+UBSan build of esid, the unit
# tests, nginx and the module, and every ctest test; then fuzzing, the bench
# smoke, static checks, the build matrix and the packages.  Ends with one
# line "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${ESI_JOBS:-2}
logs=$(mktemp -d /tmp/esi-run.XXXXXX)
passed=0
failed=0

# Each step's header carries the seconds since the start, so a slow CI log
# shows where its time went.
step() { printf '\n==== [%ds] %s\n' "$SECONDS" "$*"; }

# Configure, build and test one build tree; adds to passed/failed.
suite() {
    local dir=$1; shift
    local log="$logs/$(basename "$dir").ctest.log"
    step "configure $dir $*"
    if ! cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; then
        echo "run: configure of $dir failed"
        failed=$((failed + 1))
        return
    fi
    step "build $dir"
    if ! cmake --build "$dir" -j"$jobs"; then
        echo "run: build of $dir failed"
        failed=$((failed + 1))
        return
    fi
    step "ctest $dir"
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    # "100% tests passed, 0 tests failed out of 12"
    local line
    line=$(grep -E '[0-9]+ tests failed out of [0-9]+' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "run: ctest in $dir ran no test (exit $rc)"
        failed=$((failed + 1))
        return
    fi
    local f t
    f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    t=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
    passed=$((passed + t - f))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "run: ctest in $dir exited $rc"
        failed=$((failed + 1))
    fi
}

step "dependencies"
if ! bash packaging/deps.sh; then
    echo "run: packaging/deps.sh failed"
    failed=$((failed + 1))
fi

# The unit tests are built and run once, in the sanitized build below.  Not
# a unity build: the static checks read its compile_commands.json.
suite build -DESI_UNIT_TESTS=OFF -DCMAKE_UNITY_BUILD=OFF

# The .debs (and lintian) build in the background at the lowest priority,
# on what the steps below leave idle (integration tests mostly wait on
# sockets, fuzzing and lintian use one core); the packages step waits for
# them.  CI's 30 minutes need that overlap.
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
# seed corpus; each target is one pass or one fail.
step "fuzz"
fuzz_targets=$(ls tests/fuzz/corpus)
if CC=clang CXX=clang++ cmake -S "$root" -B build-fuzz \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DESI_FUZZ=ON \
        >"$logs/fuzz-build.log" 2>&1 &&
   cmake --build build-fuzz -j"$jobs" --target fuzz >>"$logs/fuzz-build.log" 2>&1
then
    for t in $fuzz_targets; do
        if bash tests/fuzz/fuzz.sh build-fuzz "$t" "${ESI_FUZZ_SECONDS:-5}"; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    done
else
    tail -n 40 "$logs/fuzz-build.log"
    echo "run: fuzz build failed"
    failed=$((failed + $(wc -w <<<"$fuzz_targets")))
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
    failed=$((failed + 1))
fi

# Runs a script whose last summary line is "NAME: N passed, N failed" and
# adds its counts; a script that ends without one is one failure.
counted() {
    local name=$1; shift
    local log="$logs/$name.log"
    "$@" 2>&1 | tee "$log"
    local line
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed\$" "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "run: $name ended without its summary"
        failed=$((failed + 1))
        return
    fi
    passed=$((passed + $(sed -E 's/^[^:]*: ([0-9]+) passed.*/\1/' <<<"$line")))
    failed=$((failed + $(sed -E 's/.* ([0-9]+) failed$/\1/' <<<"$line")))
}

# Static checks (tests/README.md): cppcheck and clang-tidy over the build
# above, zero findings; each tool is one pass or one fail.
step "static checks"
counted static-checks bash tests/static-checks.sh build

# Build matrix (tests/README.md): the connector against nginx without the
# gzip module, without zlib, and compiled in statically; each variant's
# build and its integration tests are one pass or one fail each.
step "build matrix"
counted build-matrix bash tests/build-matrix.sh build

# The packages (packaging/ci-packages.sh): the .debs (lintian-clean of
# errors) built from this tree and the RPM spec parsed (building the RPMs
# too would take CI past its 30 minutes); the .debs installed, esid
# socket-activated, Debian's nginx with the installed module serving an
# assembled page, esid reloaded and restarted under wrk load, esictl checked;
# then everything purged.  Each of its checks is one pass or one fail.
step "packages"
wait "$debs"
if [ "$(cat "$logs/build-deb.rc")" = 0 ]; then
    passed=$((passed + 1))
    sed -n '/^build-deb: lintian/,$p' "$logs/build-deb.log"
    echo "run: dpkg-buildpackage built the .debs, lintian reports no error"
else
    tail -n 40 "$logs/build-deb.log"
    echo "run: the .debs did not build, or lintian reports an error"
    failed=$((failed + 1))
fi
ESI_PACKAGES_PREBUILT=1 ESI_PACKAGES_RPM=spec counted packages \
    bash packaging/ci-packages.sh "$root/build-packages"

rm -rf "$logs"
echo
echo "run: took ${SECONDS}s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
