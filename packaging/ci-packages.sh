#!/usr/bin/env bash
# CI check of the packages, as root on a Debian 12 machine:
#
#   1. build the .debs (packaging/build-deb.sh: dpkg-buildpackage + lintian)
#      and the RPMs (packaging/build-rpm.sh);
#   2. install the .debs with apt-get;
#   3. start the installed esid socket-activated as the esid user (in
#      /run/esid, which the package makes esid's): through
#      systemd where systemd runs the machine, otherwise through
#      systemd-socket-activate, which holds the socket while a small loop
#      restarts esid on it, as esid.socket + Restart= would, with the unit's
#      user, groups, capability (CAP_DAC_READ_SEARCH alone), no_new_privs
#      and umask;
#   4. run Debian's nginx with a test config that includes the installed
#      modules-available snippet, its workers as www-data, proxying to an
#      origin on 127.0.0.1, and fetch an assembled page, compared byte for
#      byte;
#   5. reload esid (SIGHUP) under wrk load: every body assembled; restart it
#      under wrk load: every body the assembled page, or the page as the
#      origin sent it (esi_fallback passthrough) only once the restart
#      began, every answer 200, no socket error; once the workers are
#      attached again, every page assembled;
#   6. esictl stats, stats --json, stats --prometheus and top --once against
#      the running esid, each with an assertion on its output, and its
#      one-line errors;
#   7. purge as the packages deploy it: a proxy_cache zone in a directory
#      NGINX makes www-data's, 0700 (/var/cache/nginx/esi-ci-packages);
#      three Vary variants of a page cached; esid restarted, its index
#      rebuilt from that directory (which esid, as user esid, reads only
#      through CAP_DAC_READ_SEARCH); a PURGE removes all three (count=3,
#      the files gone, each variant a MISS again);
#   8. control_group (adm) set and esid reloaded: a member of it (and of
#      the socket's group) reads esictl stats, other users are refused;
#   9. purge the packages, leaving the machine as it was.
#
# Prints "ok - ..." or "not ok - ..." per check and ends with
# "packages: N passed, N failed"; exits non-zero on any failure.
#
#     packaging/ci-packages.sh [OUTDIR]     # packages go to OUTDIR
#                                           # (default build-packages)
#
# ESI_PACKAGES_PREBUILT=1 skips step 1 and uses the packages already in
# OUTDIR (for working on the later steps).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build-packages}")
work=$(mktemp -d /tmp/esi-ci-packages.XXXXXX)
started=$(date +%s)
socket=/run/esid/esid.sock
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
# check DESCRIPTION COMMAND...: one check, passed when COMMAND succeeds.
check() {
    local what=$1; shift
    if "$@"; then ok "$what"; else not_ok "$what"; fi
}
step() { printf '\n---- %s\n' "$*"; }

finish() {
    echo
    echo "packages: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

if [ "$(id -u)" -ne 0 ]; then
    echo "ci-packages: must run as root (it installs packages)" >&2
    exit 1
fi

# ---------------------------------------------------------------- build

if [ "${ESI_PACKAGES_PREBUILT:-}" = 1 ]; then
    echo "ci-packages: using the packages in $out"
else
step "build the .debs"
# nocheck: run.sh runs the tests; noautodbgsym: no -dbgsym packages to
# split out and lint, a minute of CI's 30.
if DEB_BUILD_OPTIONS="nocheck noautodbgsym ${DEB_BUILD_OPTIONS:-}" \
        bash "$root/packaging/build-deb.sh" "$out/deb" >"$work/build-deb.log" 2>&1; then
    ok "dpkg-buildpackage builds esid and libnginx-mod-http-esi; lintian reports no error"
else
    tail -n 40 "$work/build-deb.log"
    not_ok "dpkg-buildpackage builds esid and libnginx-mod-http-esi; lintian reports no error"
fi
sed -n '/^build-deb: lintian/,$p' "$work/build-deb.log"

# ESI_PACKAGES_RPM=spec (tests/run.sh): the spec is only parsed, its
# macros expanded; building the RPMs compiles everything once more, which
# CI's 30 minutes cannot spare.  packaging/build-rpm.sh builds them.
if [ "${ESI_PACKAGES_RPM:-build}" != spec ]; then
step "build the RPMs"
if bash "$root/packaging/build-rpm.sh" "$out/rpm" >"$work/build-rpm.log" 2>&1; then
    ok "rpmbuild builds the RPMs"
else
    tail -n 40 "$work/build-rpm.log"
    not_ok "rpmbuild builds the RPMs"
fi
fi
fi
if [ "${ESI_PACKAGES_RPM:-build}" = spec ]; then
    step "parse the RPM spec"
    check "rpmspec parses packaging/rpm/esi.spec" \
        bash -c "rpmspec -P '$root/packaging/rpm/esi.spec' >/dev/null"
    check "the spec installs /etc/esid/esid.conf root:esid 0640, noreplace" \
        bash -c "rpmspec -P '$root/packaging/rpm/esi.spec' |
                 grep -x '%config(noreplace) %attr(0640,root,esid) /etc/esid/esid.conf' >/dev/null"
fi
# A man page may be compressed (Fedora's brp-compress) or not (Debian's rpm).
# (No grep -q after a pipe here: under pipefail, the writer's SIGPIPE when
# grep quits early would fail the check.)
rpm_has() { rpm -qlp "$out"/rpm/"$1"-[0-9]*.rpm 2>/dev/null | grep -Ex "$2(\.gz)?" >/dev/null; }
esid_rpm_complete() {
    rpm_has esid /usr/sbin/esid && rpm_has esid /usr/bin/esictl &&
        rpm_has esid /usr/lib/systemd/system/esid.socket &&
        rpm_has esid /usr/lib/systemd/system/esid.service &&
        rpm_has esid /etc/esid/esid.conf &&
        rpm_has esid /usr/share/man/man8/esid.8
}
module_rpm_complete() {
    rpm_has nginx-mod-http-esi /usr/lib64/nginx/modules/ngx_http_esi_module.so &&
        rpm_has nginx-mod-http-esi /usr/share/nginx/modules/mod-http-esi.conf
}
if [ "${ESI_PACKAGES_RPM:-build}" != spec ]; then
    check "the esid RPM has esid, esictl, the units, the settings and the man pages" \
        esid_rpm_complete
    check "the module RPM has the module and its load_module snippet" \
        module_rpm_complete
    check "the esid RPM installs /etc/esid/esid.conf root:esid 0640, noreplace" \
        bash -c "rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILENAMES}\\n]' \
                     '$out'/rpm/esid-[0-9]*.rpm 2>/dev/null |
                 grep -x -- '-rw-r----- root:esid cn /etc/esid/esid.conf' >/dev/null"
fi

deb_esid=$(ls "$out"/deb/esid_*.deb 2>/dev/null | head -n 1)
deb_module=$(ls "$out"/deb/libnginx-mod-http-esi_*.deb 2>/dev/null | head -n 1)
if [ -z "$deb_esid" ] || [ -z "$deb_module" ]; then
    not_ok "no .debs to install"
    finish
fi
abi=$(sed -n 's/^nginx:abi=//p' /usr/share/nginx/src/debian/libnginx-mod.abisubstvars)
check "libnginx-mod-http-esi depends on $abi, the nginx ABI it was built against" \
    bash -c "dpkg-deb -f '$deb_module' Depends | grep -qw '$abi'"

# ---------------------------------------------------------------- install

esid_user_existed=
getent passwd esid >/dev/null && esid_user_existed=1
supervisor=
nginx_pid=
# The purge test's cache zone, where the unit lets esid read
# (ReadOnlyPaths=/var/cache/nginx; /tmp is private to it under systemd).
cache=/var/cache/nginx/esi-ci-packages
cache_parent_made=
# Users of the control_group test (step 8).
ctl_member=esi-ci-ctl-member
ctl_stranger=esi-ci-ctl-stranger

cleanup() {
    set +e
    step "clean up"
    if [ -n "$nginx_pid" ] && kill -0 "$nginx_pid" 2>/dev/null; then
        kill -QUIT "$nginx_pid"
        for _ in $(seq 1 50); do kill -0 "$nginx_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$nginx_pid" 2>/dev/null
    fi
    [ -n "${origin_pid:-}" ] && kill "$origin_pid" 2>/dev/null
    if [ -n "$supervisor" ]; then
        local esid_pid
        esid_pid=$(pgrep -P "$supervisor" -x esid)
        kill -TERM "$supervisor" 2>/dev/null
        [ -n "$esid_pid" ] && kill -TERM "$esid_pid" 2>/dev/null
        sleep 0.5
        kill -KILL "$supervisor" $esid_pid 2>/dev/null
    elif [ -d /run/systemd/system ]; then
        systemctl stop esid.socket esid.service
    fi
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q esid libnginx-mod-http-esi \
        >"$work/purge.log" 2>&1 || cat "$work/purge.log"
    if [ -z "$esid_user_existed" ] && getent passwd esid >/dev/null; then
        deluser --quiet --system esid >/dev/null 2>&1
        getent group esid >/dev/null && delgroup --quiet --system esid >/dev/null 2>&1
    fi
    rm -rf /run/esid "$cache"
    [ -n "$cache_parent_made" ] && rmdir /var/cache/nginx
    for u in "$ctl_member" "$ctl_stranger"; do
        getent passwd "$u" >/dev/null && userdel "$u"
    done
    if dpkg-statoverride --list /etc/esid/esid.conf; then
        not_ok "purge removes the statoverride of /etc/esid/esid.conf"
    else
        ok "purge removes the statoverride of /etc/esid/esid.conf"
    fi
    if [ "$(dpkg-query -W -f='${db:Status-Status}' esid 2>/dev/null)" = installed ] ||
       [ -e /etc/nginx/modules-enabled/50-mod-http-esi.conf ]; then
        not_ok "purge leaves no package and no enabled module behind"
    else
        ok "purge leaves no package and no enabled module behind"
    fi
    rm -rf "$work"
}
trap 'cleanup; finish' EXIT

step "install the .debs"
# A package left installed by an earlier run is purged first.
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q esid libnginx-mod-http-esi >/dev/null 2>&1
if DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$deb_esid" "$deb_module" \
        </dev/null >"$work/install.log" 2>&1; then
    ok "apt-get installs both .debs"
else
    cat "$work/install.log"
    not_ok "apt-get installs both .debs"
    exit
fi
check "esid --version names the packaged version" \
    bash -c "/usr/sbin/esid --version | grep -qx \"esid \$(dpkg-query -W -f='\${Version}' esid)\""
check "the postinst created the esid system user, in group www-data" \
    bash -c 'id -nG esid | grep -qw www-data && [ "$(id -u esid)" -lt 1000 ]'
check "the module is enabled in /etc/nginx/modules-enabled" \
    test "$(readlink /etc/nginx/modules-enabled/50-mod-http-esi.conf)" = \
         /usr/share/nginx/modules-available/mod-http-esi.conf
check "the man pages are installed" \
    test -f /usr/share/man/man8/esid.8.gz -a -f /usr/share/man/man8/esictl.8.gz
check "systemd-analyze verify accepts the installed units" \
    bash -c 'systemd-analyze verify /lib/systemd/system/esid.socket \
                 /lib/systemd/system/esid.service >'"$work"'/verify.log 2>&1 &&
             ! grep -v "Failed to connect\|System has not been booted" '"$work"'/verify.log | grep .'
check "the packaged settings pass esid --check-config" \
    /usr/sbin/esid --config /etc/esid/esid.conf --check-config
# fleet_password goes there: esid's group reads it, other users do not.
conf_is() { [ "$(stat -c '%U:%G %a' /etc/esid/esid.conf)" = "$1" ]; }
conf_overridden() {
    conf_is "root:esid 640" &&
        [ "$(dpkg-statoverride --list /etc/esid/esid.conf)" = \
          "root esid 640 /etc/esid/esid.conf" ]
}
check "the postinst made /etc/esid/esid.conf root:esid 0640 with a dpkg-statoverride" \
    conf_overridden
# An admin's own override outlives a reinstall (postinst configure again).
dpkg-statoverride --remove /etc/esid/esid.conf
dpkg-statoverride --update --add root esid 0600 /etc/esid/esid.conf
dpkg -i "$deb_esid" >"$work/reinstall.log" 2>&1 || cat "$work/reinstall.log"
check "a reinstall keeps the admin's own statoverride of esid.conf (0600)" conf_is "root:esid 600"
dpkg-statoverride --remove /etc/esid/esid.conf
dpkg -i "$deb_esid" >>"$work/reinstall.log" 2>&1 || cat "$work/reinstall.log"
check "without an override, configure sets root:esid 0640 again" conf_is "root:esid 640"
# NGINX's workers trust esid's socket as the owner of its directory: esid
# listens again on the socket systemd passes it, and is then its peer.
check "the postinst made /run/esid esid's, 0755 (tmpfiles.d)" \
    test "$(stat -c '%U:%G %a' /run/esid 2>/dev/null)" = "esid:esid 755"

# ---------------------------------------------------------------- esid

esid_pid() {
    if [ -n "$supervisor" ]; then
        pgrep -P "$supervisor" -x esid
    else
        systemctl show -p MainPID --value esid.service | grep -v '^0$'
    fi
}
wait_for() {  # wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

step "start esid, socket-activated"
if [ -d /run/systemd/system ]; then
    echo "systemd runs this machine: esid.socket"
    systemctl start esid.socket
else
    echo "systemd is not PID 1 here: systemd-socket-activate, with a restart loop as the esid user"
    # /run/esid is the postinst's (tmpfiles.d), checked above.
    # The loop plays esid.service: same user and groups (User=, Group=,
    # SupplementaryGroups=www-data, which the postinst made esid's), its
    # only privilege CAP_DAC_READ_SEARCH (AmbientCapabilities=,
    # CapabilityBoundingSet=: esid reads NGINX's 0700 cache directories
    # with it, step 7), no_new_privs and umask; it keeps the socket (fd 3)
    # across esid's restarts, like esid.socket.  Not reproduced: the rest
    # of the unit's sandbox (ProtectSystem=, PrivateTmp=, the system call
    # filter...), which needs systemd.
    # shellcheck disable=SC2016
    (exec setsid systemd-socket-activate -l "$socket" \
         setpriv --reuid=esid --regid=esid --init-groups --no-new-privs \
             --bounding-set=-all,+dac_read_search \
             --inh-caps=-all,+dac_read_search \
             --ambient-caps=-all,+dac_read_search \
         bash -c 'umask 0077
                  while :; do
                      (export LISTEN_PID=$BASHPID; exec /usr/sbin/esid --config /etc/esid/esid.conf)
                      sleep 0.1
                  done') >"$work/esid.log" 2>&1 &
    supervisor=$!
    # systemd-socket-activate creates it 0644 root:root: make it what
    # esid.socket makes it before any worker connects.
    wait_for 10 test -S "$socket"
    chgrp www-data "$socket"
    chmod 0660 "$socket"
fi
check "esid's socket is 0660 and belongs to group www-data" \
    test "$(stat -c '%a %G' "$socket" 2>/dev/null)" = "660 www-data"

# ---------------------------------------------------------------- nginx

step "nginx with the installed module, an origin on 127.0.0.1"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
origin_port=$(free_port)
mkdir -p "$work/www/esi" "$work/tmp"
chown www-data "$work/tmp"
chmod 755 "$work"
printf '<html><body>\n<esi:include src="/esi/header"/>\n<p>page</p>\n<esi:include src="/esi/cart"/>\n<esi:remove>not shown</esi:remove><!--esi <p>esi comment</p>-->\n</body></html>\n' \
    >"$work/www/page"
printf '<header>shop</header>' >"$work/www/esi/header"
printf '<div id="cart">3 items</div>' >"$work/www/esi/cart"
printf '<html><body>\n<header>shop</header>\n<p>page</p>\n<div id="cart">3 items</div>\n <p>esi comment</p>\n</body></html>\n' \
    >"$work/expected"
chmod -R a+rX "$work/www"
# The purge test's zone: NGINX itself makes its directory (as root, before
# the workers start: www-data's, 0700), as for any proxy_cache_path.
rm -rf "$cache"
if [ ! -d /var/cache/nginx ]; then
    mkdir -m 0755 /var/cache/nginx
    cache_parent_made=1
fi

cat >"$work/nginx.conf" <<CONF
include /usr/share/nginx/modules-available/mod-http-esi.conf;
user www-data;
worker_processes 2;
pid $work/nginx.pid;
error_log $work/error.log info;
events { worker_connections 1024; }
http {
    log_format esi '\$request_uri \$status \$esi_status';
    access_log $work/access.log esi;
    client_body_temp_path $work/tmp/body;
    proxy_temp_path $work/tmp/proxy;
    fastcgi_temp_path $work/tmp/fastcgi;
    uwsgi_temp_path $work/tmp/uwsgi;
    scgi_temp_path $work/tmp/scgi;
    esi_daemon unix:$socket;
    proxy_cache_path $cache levels=1:2 keys_zone=esi_ci:1m use_temp_path=off;

    upstream origin { server 127.0.0.1:$origin_port; keepalive 16; }
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            esi on;
        }
        location /esi/ {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location /v/ {                         # the purge test (step 7)
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache esi_ci;
            proxy_cache_valid 200 10m;
            proxy_cache_key \$uri\$is_args\$args;
            add_header X-Cache-Status \$upstream_cache_status always;
            esi_cache_purge PURGE from 127.0.0.1;
        }
    }
    server {                                   # the origin
        listen 127.0.0.1:$origin_port;
        access_log off;
        root $work/www;
        default_type text/html;
        location /v/ {                         # one body per variant
            add_header Vary X-Variant;
            return 200 "variant \$http_x_variant of \$uri\n";
        }
    }
}
CONF
if /usr/sbin/nginx -t -q -e "$work/error.log" -c "$work/nginx.conf" &&
   /usr/sbin/nginx -e "$work/error.log" -c "$work/nginx.conf"; then
    wait_for 10 test -s "$work/nginx.pid"
    nginx_pid=$(cat "$work/nginx.pid")
    ok "Debian's nginx starts with the modules-available snippet"
else
    cat "$work/error.log"
    not_ok "Debian's nginx starts with the modules-available snippet"
    exit
fi

fetch() { curl -sS --max-time 10 -o "$1" "http://127.0.0.1:$port/page"; }
assembled() { fetch "$work/got" && cmp -s "$work/expected" "$work/got"; }
# The first request socket-activates esid; a worker may need a moment to
# reconnect, and meanwhile pages pass through unassembled.
if wait_for 15 assembled; then
    ok "the page comes back assembled, byte for byte"
else
    diff <(cat "$work/expected") <(cat "$work/got" 2>/dev/null) | head -n 20
    not_ok "the page comes back assembled, byte for byte"
fi
check "the access log says esid processed it" grep -q '^/page 200 processed$' "$work/access.log"
runs_as_esid() { local pid; pid=$(esid_pid) && [ "$(ps -o user= -p "$pid")" = esid ]; }
check "esid runs as user esid" runs_as_esid

# ---------------------------------------------------------------- reload, restart under load

step "reload and restart esid under wrk load"
# As the units do it: ExecReload= checks the settings, then SIGHUP; without
# systemd a TERM makes the loop start a new esid on the same socket.
reload_esid() {
    if [ -n "$supervisor" ]; then
        /usr/sbin/esid --config /etc/esid/esid.conf --check-config >/dev/null &&
            kill -HUP "$(esid_pid)"
    else
        systemctl reload esid.service
    fi
}
restart_esid() {
    if [ -n "$supervisor" ]; then
        kill -TERM "$(esid_pid)"
    else
        systemctl restart esid.service
    fi
}
# esid_logged TEXT: esid logged TEXT since this script started.
esid_logged() {
    if [ -n "$supervisor" ]; then
        grep -F -- "$1" "$work/esid.log" >/dev/null
    else
        journalctl -q -u esid.service --since "@$started" -o cat | grep -F -- "$1" >/dev/null
    fi
}
# attached_to PID: both workers attached to esid PID.
attached_to() { [ "$(grep -c "esi: attached to esid pid $1," "$work/error.log")" -ge 2 ]; }
log_lines() { wc -l <"$work/access.log"; }
# processed_since N: a /page line after the access log's first N says processed.
processed_since() { tail -n +"$(($1 + 1))" "$work/access.log" | grep -x '/page 200 processed' >/dev/null; }
# wrk_checked NAME SECONDS ALLOWED...: wrk in the background on /page, every
# body compared with the ALLOWED files (tests/integration/check_bodies.lua),
# its tallies in $work/NAME.out.
wrk_checked() {
    local name=$1 seconds=$2; shift 2
    wrk -t1 -c8 -d"$seconds"s --timeout 5s -s "$root/tests/integration/check_bodies.lua" \
        "http://127.0.0.1:$port/page" -- "$work/$name.out" "$@" >"$work/$name.txt" 2>&1 &
    wrk_pid=$!
}
tally() { awk -v k="$2" '$1 == k {n = $2} END {print n + 0}' "$work/$1.out" 2>/dev/null; }
# wrk_clean NAME: requests made, every answer 200 with an allowed body, no
# socket error; else what went wrong, with the first bad bodies.
wrk_clean() {
    local name=$1 requests good
    requests=$(tally "$name" requests)
    good=$(tally "$name" good)
    if [ "${requests:-0}" -gt 0 ] && [ "$good" = "$requests" ] &&
       [ "$(tally "$name" bad)" = 0 ] &&
       [ "$(awk '/^errors_/ {n += $2} END {print n + 0}' "$work/$name.out")" = 0 ]; then
        return 0
    fi
    cat "$work/$name.txt" "$work/$name.out" 2>/dev/null
    for f in "$work/$name.out".bad-*; do [ -f "$f" ] && head -c 600 "$f" && echo; done
    return 1
}
# The bodies esi_fallback passthrough may send while esid restarts: the page
# assembled up to one of its elements, as the origin sent it from there on
# (the module passes the rest through when esid goes away mid-page:
# tests/integration/test_faults_load.py), from the origin's page (0) to the
# assembled one (4).
python3 - "$work" <<'PY'
import sys
work = sys.argv[1]
texts = ["<html><body>\n", "\n<p>page</p>\n", "\n", "", "\n</body></html>\n"]
elements = [('<esi:include src="/esi/header"/>', "<header>shop</header>"),
            ('<esi:include src="/esi/cart"/>', '<div id="cart">3 items</div>'),
            ("<esi:remove>not shown</esi:remove>", ""),
            ("<!--esi <p>esi comment</p>-->", " <p>esi comment</p>")]
for j in range(len(elements) + 1):
    body = texts[0] + "".join((assembled if i < j else raw) + texts[i + 1]
                              for i, (raw, assembled) in enumerate(elements))
    open("%s/allowed-%d" % (work, j), "w").write(body)
PY
check "the allowed bodies run from the origin's page to the assembled page" \
    bash -c "cmp '$work/allowed-0' '$work/www/page' && cmp '$work/allowed-4' '$work/expected'"

# A reload touches no stream: every page of the run is assembled.
cp /etc/esid/esid.conf "$work/esid.conf.orig"
printf 'log_level = debug\n' >>/etc/esid/esid.conf
mark=$(log_lines)
wrk_checked wrk-reload 3 "$work/expected"
wait_for 10 processed_since "$mark"        # wrk is under way
reload_esid
check "SIGHUP made esid re-read its settings and log the change" \
    wait_for 10 esid_logged 'SIGHUP: log_level: info -> debug'
wait "$wrk_pid"
cp "$work/esid.conf.orig" /etc/esid/esid.conf
check "wrk across esid's reload: every answer 200, every page assembled, no socket error" \
    wrk_clean wrk-reload
echo "wrk across the reload: $(tally wrk-reload requests) requests, $(tally wrk-reload good) assembled"

# A restart: pages esid stops answering pass through (esi_fallback) until
# the workers are attached to the new esid.
first_pid=$(esid_pid)
mark=$(log_lines)
wrk_checked wrk-restart 4 "$work"/allowed-[0-4]
wait_for 10 processed_since "$mark"
before_restart=$(log_lines)
restart_esid
wait "$wrk_pid"
check "wrk across esid's restart: every answer 200, the page assembled or passed through, no socket error" \
    wrk_clean wrk-restart
echo "wrk across the restart: $(tally wrk-restart requests) requests, $(tally wrk-restart allowed_5) assembled," \
     "$(tally wrk-restart allowed_1) passed through whole, the rest partly assembled"
# Lines written before the restart began are of pages answered before it.
assembled_before() {
    sed -n "$((mark + 1)),${before_restart}p" "$work/access.log" | awk '$1 == "/page"' >"$work/before.txt"
    [ -s "$work/before.txt" ] && ! grep -vx '/page 200 processed' "$work/before.txt"
}
check "every page answered before the restart began was assembled (\$esi_status processed)" \
    assembled_before
new_pid=
new_esid() { new_pid=$(esid_pid) && [ "$new_pid" != "$first_pid" ]; }
check "esid restarted: a new process serves" wait_for 10 new_esid
check "both workers attached to the new esid" wait_for 20 attached_to "$new_pid"
assembled_ten() {
    for _ in $(seq 1 10); do assembled || return 1; done
}
check "with the workers attached again, every page is assembled (10 of 10)" assembled_ten

# ---------------------------------------------------------------- esictl

step "esictl against the running esid"
for _ in 1 2 3; do fetch /dev/null; done
esictl stats >"$work/stats.txt" 2>&1
cat "$work/stats.txt"
check "esictl stats counts the pages since the restart" \
    grep -Eq '^streams [1-9][0-9]*$' "$work/stats.txt"
check "esictl stats --json is one JSON object whose streams and includes are counted" \
    python3 -c '
import json, subprocess, sys
doc = json.loads(subprocess.run(["esictl", "stats", "--json"], check=True,
                                capture_output=True).stdout)
sys.exit(0 if doc["streams"] >= 3 and doc["includes"] >= 6 and doc["errors"] == 0 else 1)'
esictl stats --prometheus >"$work/prom.txt" 2>&1
head -n 6 "$work/prom.txt"
check "esictl stats --prometheus has HELP/TYPE lines and esid_ samples (labels, histograms)" \
    bash -c "grep -qx '# TYPE esid_streams_total counter' '$work/prom.txt' &&
             grep -q '^# HELP esid_streams_total ' '$work/prom.txt' &&
             grep -Eq '^esid_streams_total [1-9][0-9]*$' '$work/prom.txt' &&
             ! grep -Ev '^(# (HELP|TYPE) esid_[a-z_]+ .+|esid_[a-z_]+(\{[a-z_]+=\"[^\"]*\"(,[a-z_]+=\"[^\"]*\")*\})? [0-9][0-9.e+]*)$' '$work/prom.txt'"
(for _ in $(seq 1 30); do fetch /dev/null; sleep 0.05; done) &
load_pid=$!
esictl top --once --interval 1 >"$work/top.txt" 2>&1
wait "$load_pid"
cat "$work/top.txt"
check "esictl top --once shows a streams rate and the workers' connections" \
    bash -c "grep -Eq '^streams +[0-9]+\.[0-9] +[0-9]+$' '$work/top.txt' &&
             grep -Eq '^active connections +[1-9]' '$work/top.txt'"
check "esictl refuses a caller that is neither root nor esid, in one line, exit 1" \
    bash -c "setpriv --reuid=www-data --regid=www-data --init-groups esictl stats >'$work/deny.txt' 2>&1
             [ \$? -eq 1 ] && [ \$(wc -l <'$work/deny.txt') -eq 1 ] &&
             grep -q 'permission denied' '$work/deny.txt'"
check "esictl says esid is not running when there is no socket, exit 1" \
    bash -c "esictl --socket '$work/none.sock' stats 2>'$work/none.txt'
             [ \$? -eq 1 ] && grep -qx 'esictl: esid is not running: no socket at $work/none.sock' '$work/none.txt'"

# ---------------------------------------------------------------- purge, as packaged

step "purge every Vary variant after an esid restart, esid as user esid"
# get_variant NAME: GET /v/page as variant NAME (X-Variant, which the origin
# varies on); the body goes to $work/v.body; prints X-Cache-Status.
get_variant() {
    curl -sS --max-time 10 -H "X-Variant: $1" -D "$work/v.head" -o "$work/v.body" \
        "http://127.0.0.1:$port/v/page" &&
        tr -d '\r' <"$work/v.head" | sed -n 's/^X-Cache-Status: //ip'
}
# variant_is NAME STATUS: variant NAME comes with its own body, a STATUS.
variant_is() {
    local got
    got=$(get_variant "$1")
    if [ "$got" = "$2" ] && [ "$(cat "$work/v.body")" = "variant $1 of /v/page" ]; then
        return 0
    fi
    echo "variant $1: expected a $2 with \"variant $1 of /v/page\"," \
         "got a ${got:-response without X-Cache-Status}: $(head -c 200 "$work/v.body" 2>/dev/null)"
    return 1
}
cache_files() { find "$cache" -type f -regextype posix-extended -regex '.*/[0-9a-f]{32}' | sort; }
check "NGINX made the zone's directory www-data's, 0700 (esid as esid reads it only through CAP_DAC_READ_SEARCH)" \
    test "$(stat -c '%U %a' "$cache" 2>/dev/null)" = "www-data 700"
three_cached() {
    variant_is a MISS && variant_is b MISS && variant_is c MISS &&
        variant_is a HIT && variant_is b HIT && variant_is c HIT
}
check "three Vary variants of /v/page cached, each with its own body (a MISS, then a HIT)" \
    three_cached
cache_files >"$work/cache-files.txt"
cat "$work/cache-files.txt"
check "the zone's directory holds their three files" \
    test "$(wc -l <"$work/cache-files.txt")" -eq 3

# The new esid knows nothing of them: its index of the zone is rebuilt from
# the zone's directory when a worker announces the zone.
first_pid=$(esid_pid)
restart_esid
new_pid=
check "esid restarted: a new process serves" wait_for 10 new_esid
# What esid.service gives esid: User=esid, CapabilityBoundingSet= and
# AmbientCapabilities=CAP_DAC_READ_SEARCH (bit 2), NoNewPrivileges=yes.
privileged_as_unit() {
    local status=/proc/$new_pid/status
    [ "$(ps -o user= -p "$new_pid")" = esid ] &&
        grep -x $'CapEff:\t0000000000000004' "$status" >/dev/null &&
        grep -x $'CapBnd:\t0000000000000004' "$status" >/dev/null &&
        grep -x $'NoNewPrivs:\t1' "$status" >/dev/null && return 0
    grep -E '^(Uid|Cap|NoNewPrivs)' "$status"
    return 1
}
check "the new esid runs as esid with the unit's privileges: CAP_DAC_READ_SEARCH alone, no_new_privs" \
    privileged_as_unit
check "both workers attached to the new esid" wait_for 20 attached_to "$new_pid"
# zone_is PYTHON-EXPR: esictl zones --json says so of zone esi_ci (z).
zone_is() {
    esictl zones --json >"$work/zones.json" 2>&1 &&
        python3 -c 'import json, sys
z = json.load(open(sys.argv[1])).get("esi_ci")
sys.exit(0 if z and eval(sys.argv[2]) else 1)' "$work/zones.json" "$1"
}
rebuilt() {
    wait_for 20 zone_is 'z["scans"] >= 1 and not z["scanning"]' &&
        zone_is 'z["complete"] and z["files"] == 3 and not z["last_scan_error"]' && return 0
    cat "$work/zones.json"
    grep -F 'zone esi_ci' "$work/esid.log" 2>/dev/null | tail -n 5
    return 1
}
check "esid rebuilt the zone's index from its directory: complete, 3 files, no scan error" rebuilt

curl -sS --max-time 30 -X PURGE -D "$work/purge.head" -o "$work/purge.body" \
    "http://127.0.0.1:$port/v/page"
tr -d '\r' <"$work/purge.head" >"$work/purge.txt"
purged_three() {
    head -n 1 "$work/purge.txt" | grep -E '^HTTP/1\.1 200 ' >/dev/null &&
        grep -ix 'Cache-Purge-Result: exact; count=3' "$work/purge.txt" >/dev/null && return 0
    cat "$work/purge.txt" "$work/purge.body"
    grep -F 'purge of' "$work/error.log" | tail -n 3
    return 1
}
check "PURGE /v/page answers 200, Cache-Purge-Result: exact; count=3" purged_three
check "the error log says the purge found them in the rebuilt index" \
    grep -qF 'esi: exact purge of "/v/page": 3 file(s) removed, via variant index' "$work/error.log"
check "the three files are gone from the zone's directory" \
    bash -c "[ -z \"\$(find '$cache' -type f -regextype posix-extended -regex '.*/[0-9a-f]{32}')\" ]"
three_missed() { variant_is a MISS && variant_is b MISS && variant_is c MISS; }
check "each variant is a MISS again, with its own body" three_missed

# ---------------------------------------------------------------- control_group

step "esictl as a member of control_group, and as others"
# control_group members may use esictl (esid(8)); connecting at all takes
# the socket's group (www-data, esid.socket), as esictl(8) says.
for u in "$ctl_member" "$ctl_stranger"; do
    getent passwd "$u" >/dev/null && userdel "$u"
done
useradd --system --no-create-home --shell /usr/sbin/nologin --user-group \
    --groups adm,www-data "$ctl_member"
useradd --system --no-create-home --shell /usr/sbin/nologin --user-group \
    --groups www-data "$ctl_stranger"
# esictl_as USER OUT: esictl stats as USER (its groups from /etc/group).
esictl_as() { setpriv --reuid="$1" --regid="$1" --init-groups esictl stats >"$2" 2>&1; }
# refused USER: esid refuses USER's esictl stats in one line, exit 1.
refused() {
    esictl_as "$1" "$work/refused.txt"
    local rc=$?
    [ "$rc" -eq 1 ] && [ "$(wc -l <"$work/refused.txt")" -eq 1 ] &&
        grep 'permission denied: uid [0-9]* may not control esid' "$work/refused.txt" >/dev/null &&
        return 0
    echo "exit $rc:"; cat "$work/refused.txt"
    return 1
}
check "without control_group, esid refuses a member of adm" refused "$ctl_member"
cp /etc/esid/esid.conf "$work/esid.conf.orig"
printf 'control_group = adm\n' >>/etc/esid/esid.conf
reload_esid
member_reads() { esictl_as "$ctl_member" "$work/member.txt" && grep -E '^streams [0-9]+$' "$work/member.txt" >/dev/null; }
if wait_for 10 member_reads; then
    ok "control_group = adm and a reload: a member of adm reads esictl stats"
else
    cat "$work/member.txt"
    not_ok "control_group = adm and a reload: a member of adm reads esictl stats"
fi
check "esid logged the new control_group" \
    wait_for 10 esid_logged 'SIGHUP: control_group: (none) -> adm'
check "esid still refuses a user outside adm (in www-data, the socket's group)" \
    refused "$ctl_stranger"
cp "$work/esid.conf.orig" /etc/esid/esid.conf

if grep -E 'exited on signal|\[alert\]|\[emerg\]' "$work/error.log"; then
    not_ok "nginx's error log has no crash, alert or emerg"
else
    ok "nginx's error log has no crash, alert or emerg"
fi
