#!/usr/bin/env bash
# Static checks (tests/README.md, "Static checks"): cppcheck over the daemon,
# the connector, include/ and the fuzz targets, then clang-tidy over the
# daemon's sources with the top-level .clang-tidy and the connector's with
# nginx-connector/.clang-tidy.  Zero findings at the documented level, or
# the check fails.
#
#   tests/static-checks.sh [BUILD_DIR]
#
# BUILD_DIR (default build/) is a configured and built tree of this project:
# clang-tidy reads its compile_commands.json, cppcheck and clang-tidy read
# the NGINX tree the connector was configured in
# (BUILD_DIR/nginx-connector/nginx) for NGINX's headers and flags.  A tree that is not built yet is built first.  Ends with
# "static-checks: N passed, N failed" (one entry per tool).
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
build=$(realpath -m "${1:-build}")
jobs=${ESI_JOBS:-2}
passed=0
failed=0

# Debian 12's cppcheck 2.10 and clang-tidy 14, installed when missing.
need=()
command -v cppcheck >/dev/null || need+=(cppcheck)
command -v run-clang-tidy >/dev/null || need+=(clang-tidy)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "static-checks: ${need[*]} missing; apt-get install ${need[*]}" >&2
        echo "static-checks: 0 passed, 2 failed"
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${need[@]}" </dev/null >/dev/null
fi

ngx=$build/nginx-connector/nginx
if [ ! -f "$build/compile_commands.json" ] || [ ! -f "$ngx/objs/ngx_auto_config.h" ] ||
   [ ! -f "$build/esid" ]; then
    echo "static-checks: building $build first"
    if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
                 -DCMAKE_UNITY_BUILD=OFF &&
           cmake --build "$build" -j"$jobs"; } >/dev/null; then
        echo "static-checks: the build of $build failed"
        echo "static-checks: 0 passed, 2 failed"
        exit 1
    fi
fi

result() {
    if [ "$1" -eq 0 ]; then
        passed=$((passed + 1))
        echo "static-checks: $2: no findings"
    else
        failed=$((failed + 1))
        echo "static-checks: $2: FAILED (findings above)"
    fi
}

# cppcheck: warnings, performance and portability, every finding an error;
# tests/static/cppcheck.supp lists what is left out, each with its reason.
cppcheck_common=(
    --enable=warning,performance,portability --inline-suppr
    --error-exitcode=1 --quiet -j"$jobs"
    --suppressions-list=tests/static/cppcheck.supp
    --template='{file}:{line}:{column}: {severity} [{id}] {message}'
)
# The C++ side: system headers are not read (the posix, googletest and
# zlib libraries tell cppcheck what it needs of them), nor the generated
# esi.capnp.h (a quoted include that is not found is not a finding).
cppcheck "${cppcheck_common[@]}" --std=c++20 --language=c++ \
    --library=posix,googletest,zlib \
    -I include -I daemon \
    daemon include tests/fuzz tests/unit
cxx=$?
# The connector, C, with NGINX's headers from the configured tree: one
# configuration (NGINX's ngx_auto_config.h says which), as the build
# compiles it, instead of every #ifdef combination.
ngx_incs=()
for d in src/core src/event src/event/modules src/os/unix src/http \
         src/http/modules src/http/v2 objs; do
    ngx_incs+=(-I "$ngx/$d")
done
cppcheck "${cppcheck_common[@]}" --std=c99 --language=c \
    --library=posix,zlib -D__linux__ -D__GNUC__ \
    "${ngx_incs[@]}" -I include -I nginx-connector -I "$build/proto/c" \
    nginx-connector/*.c
c=$?
result $((cxx | c)) cppcheck

# clang-tidy: .clang-tidy's checks over every daemon source as the build
# compiles them, and nginx-connector/.clang-tidy's over every connector
# source as NGINX compiles them; the tests are not checked (gtest's macros
# are a world of their own).
# A unity build's compile_commands.json names no source of ours: nothing
# would be checked.
if ! grep -q "\"file\": \"$root/daemon/engine/stream.cc\"" "$build/compile_commands.json"; then
    echo "static-checks: $build is a unity build (configure it with" \
         "-DCMAKE_UNITY_BUILD=OFF): clang-tidy would check nothing"
    echo "static-checks: $passed passed, $((failed + 1)) failed"
    exit 1
fi
tidy_quiet() {
    sed -e 's/\x1b\[[0-9;]*m//g' \
        -e '/^clang-tidy[-0-9]* /d' -e '/^[0-9]* warnings* generated\.$/d'
}
run-clang-tidy -quiet -j "$jobs" -p "$build" \
    "^$root/daemon/(?!.*-test\\.cc\$).*\\.cc\$" 2>&1 | tidy_quiet
tidy=${PIPESTATUS[0]}

# The connector is compiled by NGINX's make, which CMake's
# compile_commands.json does not see: one of its own, every .c with the
# flags and include paths of the configured tree's objs/Makefile.
tidy_db=$(mktemp -d)
trap 'rm -rf "$tidy_db"' EXIT
ngx_flags=$(printf 'include objs/Makefile\nesi-flags:\n\t@echo $(CFLAGS) $(ALL_INCS)\n' |
            make -s -C "$ngx" -f - esi-flags)
python3 - "$ngx" "$ngx_flags" "$tidy_db/compile_commands.json" \
    "$root"/nginx-connector/*.c <<'PY'
import json, shlex, sys
ngx, flags, out, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
json.dump([{"directory": ngx, "file": f,
            "arguments": ["cc", "-c"] + shlex.split(flags) + [f]}
           for f in files], open(out, "w"), indent=1)
PY
run-clang-tidy -quiet -j "$jobs" -p "$tidy_db" \
    "^$root/nginx-connector/[^/]*\\.c\$" 2>&1 | tidy_quiet
tidy=$((tidy | PIPESTATUS[0]))
result "$tidy" clang-tidy

echo "static-checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
