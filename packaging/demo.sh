#!/usr/bin/env bash
# Demo: a shop page assembled from ESI fragments by Debian's nginx + esid.
#
# Installs dependencies, builds, then starts in the background (surviving
# this script) a demo origin on 127.0.0.1:8081, esid on
# /tmp/esi-demo/esid.sock and nginx on 127.0.0.1:8080, configured as the
# README's minimal configuration plus a purge: the page shell cached for an
# hour, header and footer for a minute, the cart uncached.  It then fetches
# the page a few times (plain and gzip), purges it, and prints the purge's
# answer and esictl stats.  Logs and pids: /tmp/esi-demo.  Running it again
# stops the previous demo first.  `demo.sh stop` only stops.
#
# NGINX=VERSION (e.g. NGINX=1.31.4 packaging/demo.sh) serves from that NGINX
# instead of Debian's: built with the module by packaging/build-module.sh
# from nginx-VERSION.tar.gz in ESI_NGINX_SOURCES (default: ../shared/nginx
# beside the checkout), with nginx.org's package arguments.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
demo=/tmp/esi-demo
port=8080
origin_port=8081
url=http://127.0.0.1:$port/

# Stop what a previous run started: each pid file names one of our processes.
stop_demo() {
    local name pid
    for name in nginx esid origin; do
        [ -s "$demo/$name.pid" ] || continue
        pid=$(cat "$demo/$name.pid")
        # Only if that pid is still ours (pids get reused).
        if kill -0 "$pid" 2>/dev/null &&
           tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
               grep -qE 'nginx|esid|shop\.py'; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$demo/$name.pid"
    done
}

# wait_for DESCRIPTION COMMAND...: retry COMMAND for up to 10 s.
wait_for() {
    local what=$1; shift
    for _ in $(seq 1 100); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "demo: $what did not come up; logs in $demo" >&2
    exit 1
}

if [ "${1:-}" = stop ]; then
    stop_demo
    echo "demo: stopped"
    exit 0
fi

bash packaging/deps.sh
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$root/build" -j2

# NGINX is also nginx's own variable, the listening sockets a binary upgrade
# hands on: an nginx started with NGINX=1.31.4 in its environment would not
# daemonize.
version=${NGINX:-}
unset NGINX
nginx=/usr/sbin/nginx
module=$root/build/ngx_http_esi_module.so
if [ -n "$version" ]; then
    sources=${ESI_NGINX_SOURCES:-$(realpath -m "$root/../shared/nginx")}
    tarball=$sources/nginx-$version.tar.gz
    if [ ! -f "$tarball" ]; then
        echo "demo: no $tarball (NGINX=$version); have:" \
             $(ls "$sources" 2>/dev/null | sed -n 's/^nginx-\(.*\)\.tar\.gz$/\1/p') >&2
        exit 1
    fi
    bash packaging/build-module.sh --binary \
        --args-file packaging/nginx.org-configure-args "$tarball"
    nginx=$root/build-module/nginx-$version/nginx
    module=$root/build-module/nginx-$version/ngx_http_esi_module.so
fi

stop_demo
rm -rf "$demo/cache" "$demo/temp" "$demo/esid.sock"
mkdir -p "$demo/cache" "$demo/temp"

for p in $port $origin_port; do
    if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$p/"; then
        echo "demo: something else already answers on 127.0.0.1:$p" >&2
        exit 1
    fi
done

cat > "$demo/nginx.conf" <<CONF
user root;
worker_processes 1;
pid $demo/nginx.pid;
error_log $demo/error.log info;
load_module $module;

events { worker_connections 1024; }

http {
    log_format esi '\$remote_addr [\$time_local] "\$request" \$status '
                   'cache=\$upstream_cache_status esi=\$esi_status';
    access_log $demo/access.log esi;
    client_body_temp_path $demo/temp/body;
    proxy_temp_path $demo/temp/proxy;
    fastcgi_temp_path $demo/temp/fastcgi;
    uwsgi_temp_path $demo/temp/uwsgi;
    scgi_temp_path $demo/temp/scgi;

    esi_daemon unix:$demo/esid.sock;
    proxy_cache_path $demo/cache keys_zone=pages:16m;
    open_file_cache max=1000;
    gzip on;

    server {
        listen 127.0.0.1:$port;

        # The page shell: cached for an hour; its plan replayed on every hit
        # and gzip clients answered from its stored segments.  PURGE from
        # this machine removes it (every Vary variant).
        location / {
            proxy_pass http://127.0.0.1:$origin_port;
            proxy_cache pages;
            proxy_cache_key \$uri\$is_args\$args;
            proxy_cache_valid 200 1h;
            add_header X-Cache-Status \$upstream_cache_status;
            esi on;
            esi_cache_purge PURGE from 127.0.0.1;
        }

        # Header and footer: cached for a minute.
        location ~ ^/esi/(header|footer)\$ {
            internal;
            proxy_pass http://127.0.0.1:$origin_port;
            proxy_cache pages;
            proxy_cache_valid 200 1m;
        }

        # The other fragments: not cached, so the cart is fresh every time.
        location /esi/ {
            internal;
            proxy_pass http://127.0.0.1:$origin_port;
            esi on;
        }
    }
}
CONF

setsid nohup python3 "$root/packaging/demo/shop.py" --port "$origin_port" \
    >"$demo/origin.log" 2>&1 </dev/null &
echo $! >"$demo/origin.pid"
wait_for "the demo origin" curl -fs -o /dev/null "http://127.0.0.1:$origin_port/"

setsid nohup "$root/build/esid" --socket "$demo/esid.sock" --log-level info \
    >"$demo/esid.log" 2>&1 </dev/null &
echo $! >"$demo/esid.pid"
wait_for "esid" test -S "$demo/esid.sock"

# nginx daemonizes itself and writes $demo/nginx.pid.
"$nginx" -p "$demo/" -e "$demo/error.log" -c "$demo/nginx.conf"
wait_for "nginx" curl -fs -o /dev/null "$url"

# The assembled page: fragments in, no ESI markup left.
assembled() {
    local page
    page=$(curl -fsS --max-time 10 "$url") || return 1
    grep -q '<h1>ESI demo shop</h1>' <<<"$page" &&
        grep -q 'class="cart"' <<<"$page" &&
        ! grep -q '<esi:' <<<"$page"
}
if ! wait_for "the assembled page" assembled; then
    exit 1
fi

curl -fsS "$url"
echo

# What the product does: the first hit records the page's plan, later ones
# replay it; a gzip client gets the stored segments; a purge answers with
# what it removed, and the next request is a MISS.
show() { printf '\n$ %s\n' "$*"; "$@"; }
for _ in 1 2 3; do
    curl -fsS -o /dev/null "$url"
    curl -fsS -o /dev/null -H 'Accept-Encoding: gzip' "$url"
done
show curl -sS -o /dev/null -D - -H 'Accept-Encoding: gzip' "$url"
show curl -sS -D - -X PURGE "$url"
show curl -sS -o /dev/null -D - "$url"
show "$root/build/esictl" --socket "$demo/esid.sock" stats
echo
echo "demo: $("$nginx" -v 2>&1 | sed 's/^nginx version: //') serving $url" \
     "(logs and pids in $demo; stop with $0 stop)"
