#!/usr/bin/env python3
"""Slow and vanishing clients (issue #23, item 2): the long form of
tests/integration/test_slow_clients.py.

One NGINX (the module, two workers, `esi on` in a cached location with
`gzip on`: plans and gzip stitching), its esid and an origin NGINX serving
a --page-size page (4 MB) with --includes (16) uncached fragments.  Once
the page is cached with its plan, --connections (2,000) clients ask for it
at once, each with a 4 KB receive buffer, reading at --rate bytes a second
(10 KB/s) each; --gzip of them (half) ask for gzip, and --vanish of them
(a quarter) hang up after a random part of it.  Every --interval seconds
(5) the workers' and esid's VmRSS and open fds, and esid's open streams and
segment pins, are sampled (results/DATE-slow-clients.csv).  Once every
client has read its part (or after --duration seconds), the clients
close, and the script polls until the fds, streams and pins are back to
where they were before.

Printed: each sample, the peak of each process against the bound docs/operate.md
states (Slow clients and a full disk), and whether everything came back.  Exit
status 1 when a peak passed its bound or something did not come back.

Reading 4 MB at 10 KB/s takes 400 s; --connections 200 --page-size 1m
--rate 100k is a one-minute look.
"""

import argparse
import csv
import datetime
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reporting  # noqa: E402
import support_path  # noqa: E402,F401  (tests/support on sys.path)
from esitest import (SlowClient, SlowClients, esid_bound_kib,  # noqa: E402
                     has_tcp_connections, memory_kib, nginx_fd_counts,
                     open_fds, poll, tcp_states, worker_bound_kib,
                     worker_pids)
from purge import Client  # noqa: E402
from running import Servers, exit_on_signals, loadavg  # noqa: E402
from workload import esi_tag, fragment_body, shell_filler  # noqa: E402

ORIGIN_HTTP = """\
    access_log off;
    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        root @@DIR@@/www;
        location /f/ {
            return 200 '<div class="frag">$uri</div>\\n';
        }
    }
"""

TARGET_HTTP = """\
    access_log off;
    esi_daemon unix:@@SOCKET@@;
    proxy_cache_path @@DIR@@/cache levels=1:2 keys_zone=pages:16m;
    gzip on;

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096@@SNDBUF@@;
        location / {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache pages;
            proxy_cache_valid 200 1h;
            esi on;
        }
        location /f/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            esi on;
        }
    }
"""


RING_BYTES = 1 << 20


def log(msg):
    reporting.log("slow clients: " + msg)


def size(text):
    """Bytes from 4m, 10k, 4096."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.lower()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def write_page(www, page_size, includes):
    """The origin's page; returns (path, its bytes assembled)."""
    rng = random.Random(23)
    filler = shell_filler(page_size, rng)
    piece = len(filler) // includes
    frags = ["/f/%d" % n for n in range(includes)]
    raw = b"".join(filler[n * piece:(n + 1) * piece] + esi_tag(frags[n])
                   for n in range(includes))
    with open(os.path.join(www, "page.html"), "wb") as f:
        f.write(raw)
    whole = b"".join(filler[n * piece:(n + 1) * piece]
                     + fragment_body(frags[n]) for n in range(includes))
    return "/page.html", whole


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--rate", type=size, default=10 * 1024,
                   help="bytes a second each client reads (default 10k)")
    p.add_argument("--page-size", type=size, default=4 << 20)
    p.add_argument("--includes", type=int, default=16)
    p.add_argument("--gzip", type=float, default=0.5,
                   help="share of the clients asking for gzip")
    p.add_argument("--vanish", type=float, default=0.25,
                   help="share of the clients hanging up mid-page")
    p.add_argument("--duration", type=float,
                   help="seconds of reading at the most (default: until "
                   "every client has read its part)")
    p.add_argument("--sndbuf", type=size,
                   help="NGINX's send buffer per client (listen sndbuf=; "
                   "default: the kernel's, which on loopback grows to "
                   "take most of the page off NGINX's hands)")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    args.workers = "2"

    exit_on_signals()
    # The clients' sockets here, and nginx's (which inherits the limit):
    # each client costs a worker a connection and, while a fragment is
    # fetched, an upstream one.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * args.connections + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        p.error("RLIMIT_NOFILE's hard limit %d is below the %d that %d "
                "connections need" % (hard, need, args.connections))
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    started = datetime.datetime.now()
    load_before = loadavg()
    servers = Servers(args)
    ok = False
    try:
        www = os.path.join(servers.tmp, "origin", "www")
        os.makedirs(www)
        path, whole = write_page(www, args.page_size, args.includes)
        _, origin = servers.nginx("origin", ORIGIN_HTTP.replace(
            "@@DIR@@", os.path.join(servers.tmp, "origin")))
        sock = os.path.join(servers.tmp, "esid.sock")
        esid = servers.esid("esid", sock, "--log-level", "warn",
                            "--ring-size", str(RING_BYTES))
        module = os.path.join(args.build_dir, "ngx_http_esi_module.so")
        nginx, port = servers.nginx("esi", TARGET_HTTP.replace(
            "@@SOCKET@@", sock).replace("@@ORIGIN@@", str(origin)).replace(
                "@@DIR@@", os.path.join(servers.tmp, "esi")).replace(
                "@@SNDBUF@@", " sndbuf=%d" % args.sndbuf if args.sndbuf
                else ""),
            "load_module %s;" % module)
        workers = poll(lambda: (lambda w: w if len(w) == 2 else None)(
            worker_pids(nginx.pid)))
        esictl = os.path.join(args.build_dir, "esictl")

        def stats():
            r = subprocess.run([esictl, "--socket", sock, "stats", "--json"],
                               capture_output=True, text=True, timeout=30)
            return json.loads(r.stdout)

        # The page cached, its plan recorded and replayed, plain and gzip.
        client = Client(port, timeout=60)
        for headers in ({}, {"Accept-Encoding": "gzip"}) * 3:
            status, hdrs, body = client.request("GET", path, headers)
            if hdrs.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if status != 200 or body != whole:
                raise RuntimeError("GET %s %r: %d, %d bytes, not the "
                                   "assembled page" % (path, headers, status,
                                                       len(body)))
        client.close()

        def fds():
            return nginx_fd_counts(nginx.pid, esid.pid)

        def no_tcp():
            states = tcp_states()
            return not any(has_tcp_connections(w, states) for w in workers)

        # Steady: no connection left, and the workers' copies of the plan
        # expired (esi_plan_reuse), so that nothing pins a segment.
        poll(lambda: no_tcp() and stats()["segment_pins"] == 0, bound=30.0)
        before = {"fds": fds(), "pins": stats()["segment_pins"]}
        idle = {"workers": [memory_kib(w)["VmRSS"] for w in workers],
                "esid": memory_kib(esid.pid)["VmRSS"]}
        log("idle: %r, fds %r, pins %d" % (idle, before["fds"],
                                           before["pins"]))

        rng = random.Random(7)
        clients = []
        gzip_clients = 0
        for n in range(args.connections):
            gz = rng.random() < args.gzip
            gzip_clients += gz
            quota = (rng.randrange(0, args.page_size // 2)
                     if rng.random() < args.vanish else None)
            clients.append(SlowClient(path, (("Accept-Encoding", "gzip"),)
                                      if gz else (), quota))
        slow = SlowClients(port, clients, 4096)
        t0 = time.monotonic()
        slow.connect()
        log("%d connections open in %.1f s (%d gzip, %d hanging up "
            "mid-page), reading %d B/s each" % (
                slow.open, time.monotonic() - t0, gzip_clients,
                sum(c.quota is not None for c in clients), args.rate))
        samples = []
        peak = {"workers": [0] * len(workers), "esid": 0}
        next_sample = [t0]

        def sample():
            now = time.monotonic()
            if now < next_sample[0]:
                return
            next_sample[0] += args.interval
            s = stats()
            row = {"t": round(now - t0, 1), "open": slow.open,
                   "read_bytes": sum(c.received for c in clients),
                   "esid_rss_kib": memory_kib(esid.pid)["VmRSS"],
                   "esid_fds": len(open_fds(esid.pid)),
                   "active_streams": s["active_streams"],
                   "segment_pins": s["segment_pins"]}
            for i, w in enumerate(workers):
                row["worker%d_rss_kib" % i] = memory_kib(w)["VmRSS"]
                row["worker%d_fds" % i] = len(open_fds(w))
                peak["workers"][i] = max(peak["workers"][i],
                                         row["worker%d_rss_kib" % i])
            peak["esid"] = max(peak["esid"], row["esid_rss_kib"])
            samples.append(row)
            log("t=%5.1f s  open %d, read %.1f MB  workers %s KiB (%s fds)  "
                "esid %d KiB (%d fds)  streams %d, pins %d" % (
                    row["t"], row["open"], row["read_bytes"] / 1e6,
                    "+".join(str(row["worker%d_rss_kib" % i])
                             for i in range(len(workers))),
                    "+".join(str(row["worker%d_fds" % i])
                             for i in range(len(workers))),
                    row["esid_rss_kib"], row["esid_fds"],
                    row["active_streams"], row["segment_pins"]))

        slow.read(args.rate, rate=args.rate, interval=0.1, every=sample,
                  until=lambda: args.duration is not None
                  and time.monotonic() - t0 >= args.duration)
        next_sample[0] = 0
        sample()
        complete = sum(c.complete for c in clients)
        errors = [c.error for c in clients if c.error]
        slow.close()
        # Everything back: fds, streams, pins (bounded polls).
        back = poll(lambda: no_tcp() and fds() == before["fds"] and (
            lambda s: s["active_streams"] == 0
            and s["segment_pins"] == before["pins"])(stats()), bound=60.0)
        after = {"fds": fds(), "stats": stats()}

        bound_workers = worker_bound_kib(args.connections - gzip_clients,
                                         gzip_clients, len(workers))
        bound_esid = esid_bound_kib(len(workers), max(
            r["active_streams"] for r in samples), RING_BYTES)
        log("%d answers read to their end, %d clients to hang up mid-page, "
            "%d errors; load average %s, then %s" % (complete, sum(
                c.quota is not None for c in clients), len(errors),
                load_before, loadavg()))
        log("peak VmRSS: workers %s KiB together %d KiB (idle %s), bound %d "
            "KiB: %s" % (peak["workers"], sum(peak["workers"]),
                         idle["workers"], bound_workers,
                         "within" if sum(peak["workers"]) <= bound_workers
                         else "PASSED"))
        log("peak VmRSS: esid %d KiB (idle %d), bound %d KiB: %s" % (
            peak["esid"], idle["esid"], bound_esid,
            "within" if peak["esid"] <= bound_esid else "PASSED"))
        log("after: fds %r (before %r), streams %d, pins %d (before %d): "
            "%s" % (after["fds"], before["fds"],
                    after["stats"]["active_streams"],
                    after["stats"]["segment_pins"], before["pins"],
                    "all back" if back else "NOT BACK"))
        os.makedirs(args.results, exist_ok=True)
        out = os.path.join(args.results, "%s-slow-clients.csv" %
                           started.strftime("%Y-%m-%d"))
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(samples[-1]))
            w.writeheader()
            w.writerows(samples)
        log("samples: %s" % out)
        ok = bool(back) and not errors and \
            sum(peak["workers"]) <= bound_workers and \
            peak["esid"] <= bound_esid
        return 0 if ok else 1
    finally:
        servers.finish(ok, args.keep)


if __name__ == "__main__":
    sys.exit(main())
