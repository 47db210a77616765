#!/usr/bin/env bash
# Install every build and test dependency from Debian 12's own packages.
# Idempotent: runs apt-get only for packages that are missing.  Run as root.
#
# nginx's postinst starts the system nginx on port 80 where it can (and
# redis-server's a system Redis); we do not
# want that (the tests and the demo run their own nginx), so services are kept
# from starting during the install, and a system nginx that this script
# started anyway is stopped again.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git python3 curl ca-certificates
    nginx nginx-dev libnginx-mod-http-echo
    libuv1-dev zlib1g-dev capnproto libcapnp-dev
    libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libcli11-dev
    nlohmann-json3-dev libssl-dev libpcre2-dev libre2-dev
    clang libclang-rt-14-dev llvm-14
    systemd
    debhelper dpkg-dev lintian rpm wrk nghttp2-client openssl
    ngtcp2-client libnghttp3-dev
    redis-server fcgiwrap libhiredis-dev uwsgi-core uwsgi-plugin-python3
    python3-prometheus-client
    libtest-base-perl
)

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = installed ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all ${#packages[@]} packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing ${missing[*]}; run this script as root" >&2
    exit 1
fi

echo "deps: installing ${missing[*]}"

nginx_before=$(pgrep -x nginx || true)

# Debian's way to keep maintainer scripts from starting services.
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    own_policy=1
fi
cleanup() { [ -z "$own_policy" ] || rm -f "$policy"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null

# If the install started the system nginx anyway, stop what it started.
if [ -z "$nginx_before" ] && pgrep -x nginx >/dev/null; then
    if [ -s /run/nginx.pid ]; then
        master=$(cat /run/nginx.pid)
        kill -TERM "$master" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$master" 2>/dev/null || break
            sleep 0.1
        done
    fi
    if pgrep -x nginx >/dev/null; then
        echo "deps: warning: a system nginx is running" >&2
    fi
fi
echo "deps: done"
