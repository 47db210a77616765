#!/usr/bin/env python3
"""Purge against the NGINX purge modules (issue 35, part 3), behind
`bench/run.sh --purge-peers`.

Per zone size (--sizes 10k,100k,1m), each target in an nginx of its own
(`worker_processes 1`) over its own copy of the same generated zone
(purge.py's generator: NGINX's on-disk format, one key in ten Vary'd with
two files, every object tagged `X-Magento-Tags: store,TAG`):

  ours          the module + esid, variant index sized for the zone
  cache_purge   ngx_cache_purge 3.0.1 as it ships (Vary scan off)
  cache_purge_vary
                ngx_cache_purge 3.0.1 with `cache_purge_vary_aware on`
                (its opt-in directory walk after each exact purge): the
                exact rows only
  cache_pilot   ngx_cache_pilot 2.0.0 with its index (shared memory, sized
                for the zone), tags read from X-Magento-Tags

and the rows each can do, in this order, every purge of keys never purged
before and checked by the files on disk:

  exact     a Vary'd key: both files must go
  wildcard  `KEY*` of a Vary'd key no other key starts with: both files
  tag       the key's own tag: both files
  soft      exact, marked stale: both files stay, both variants then
            answer EXPIRED
  storm     exact purges of plain keys at --storm-rate (1,000/s) for
            --storm-seconds from 16 connections: the rate reached, latency,
            every file gone
  restart   nginx stopped and started again (esid left running): exact
            purges of fresh Vary'd keys from the start, until one removes
            both files (the time is from the new nginx's start)
  all       everything in the zone: no file may be left

A probe sends cache HITs on 32 other keys to the same worker throughout,
one every 1 ms (purge.py's Probe); its samples are split by what they
overlapped (purge.classify): a row's purges, or nothing (at rest).  The
workers' and esid's VmRSS are read after the storm.  A row a target cannot
do, a wrong answer or a crash is recorded, not fatal.

--smoke: 1k files, one purge a row, a storm of 0.5 s, no restart, no wait
for NGINX's cache loader or the indexes.  The exit status is 1 when one of
our rows was wrong or our nginx died: the peers' wrong answers and crashes
are results.
"""

import argparse
import csv
import datetime
import gc
import json
import math
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import purge  # noqa: E402
import reporting  # noqa: E402
import support_path  # noqa: E402,F401  (tests/support on sys.path)
from esitest import fill, memory_kib, poll, worker_pids  # noqa: E402
from purge import (Client, Probe, SIZES, Zone,  # noqa: E402
                   classify, files_of, plain_key, summary, tag_of, vary_key)
from reporting import fmt_ms, update_readme  # noqa: E402
from running import exit_on_signals, loadavg, machine_info  # noqa: E402


def log(msg):
    reporting.log("purge-peers: " + msg)


TARGETS = ("ours", "cache_purge", "cache_purge_vary", "cache_pilot")
# Short names, for the ratio columns.
SHORT = {"ours": "ours", "cache_purge": "cache_purge",
         "cache_purge_vary": "cache_purge vary_aware",
         "cache_pilot": "cache_pilot"}
LABEL = {"ours": "ours (module + esid, variant index)",
         "cache_purge": "ngx_cache_purge 3.0.1",
         "cache_purge_vary":
             "ngx_cache_purge 3.0.1, `cache_purge_vary_aware on`",
         "cache_pilot": "ngx_cache_pilot 2.0.0"}
ROWS = ("exact", "wildcard", "tag", "soft", "storm", "restart", "all")
# What each target offers; a row missing here is "cannot".
CAN = {"ours": set(ROWS),
       # As shipped, its exact purge never removes both files, restarted
       # or not: the restart row is the vary_aware one's.
       "cache_purge": {"exact", "wildcard", "storm", "all"},
       "cache_purge_vary": {"exact", "restart"},
       "cache_pilot": set(ROWS)}

# purge.py's server (its cache key, the origin of a MISS) around the zone's
# location and one for everything.
CACHE_PATH = """\
    proxy_cache_path @@PATH@@ levels=1:2 keys_zone=@@ZONE@@:@@MB@@m
                     inactive=30d use_temp_path=off loader_files=100000
                     loader_sleep=1ms loader_threshold=60000ms;"""
ALL_LOCATION = """\
        location = /all/@@ZONE@@ {
@@PURGE_ALL@@
        }
"""

# Each target's directives, from its README: ngx_cache_purge's separate-
# location form (its same-location form crashed Debian's 2.3 on 1.22.1,
# purge.py); cache_pilot's same-location form with a map, its index and
# mode header.  The peers' purge_all is a flag of their same-location form:
# a cached location of its own.
CACHED = """\
            proxy_pass http://127.0.0.1:@@PORT@@/origin/;
            proxy_cache @@ZONE@@;
"""
CONF = {
    "ours": {
        "HTTP_EXTRA": "    esi_daemon unix:@@SOCKET@@;\n"
                      "    esi_purge_index @@INDEX@@;\n"
                      "    esi_purge_timeout 3600s;",
        "PURGE": "            esi_cache_purge PURGE from 127.0.0.1;",
        "PURGE_ALL": "            esi_cache_purge zone=@@ZONE@@ key=*;",
        "LOCATIONS": ""},
    "cache_purge": {
        "HTTP_EXTRA": "",
        "PURGE": "",
        "PURGE_ALL": CACHED + "            proxy_cache_purge PURGE purge_all "
                     "from 127.0.0.1;",
        "LOCATIONS": """\
        location ~ ^/cp(/@@ZONE@@/.*)$ {
            allow 127.0.0.1;
            deny all;
            proxy_cache_purge @@ZONE@@ $1$is_args$args;
        }
"""},
    "cache_pilot": {
        "HTTP_EXTRA": """\
    cache_pilot_index_zone_size @@INDEX@@;
    cache_pilot_tag_headers X-Magento-Tags;
    cache_pilot_purge_mode_header X-Purge-Mode;
    map $request_method:$remote_addr $purge_request {
        default off;
        PURGE:127.0.0.1 on;
    }""",
        "PURGE": "            proxy_cache_purge $purge_request;\n"
                 "            cache_pilot_index on;",
        "PURGE_ALL": CACHED + "            proxy_cache_purge $purge_request "
                     "purge_all;",
        "LOCATIONS": """\
        location = /_stats {
            cache_pilot_stats;
        }
"""},
}
CONF["cache_purge_vary"] = dict(
    CONF["cache_purge"], HTTP_EXTRA="    cache_purge_vary_aware on;")


# The rows in which a target walks the zone's directory for every purge.
WALKS = {("cache_purge", "wildcard"), ("cache_purge_vary", "exact")}


def counts_for(files, smoke, name):
    """Purges per row: fewer where each walks the directory (a warm walk
    of 1M files took 47 s here, purge.py)."""
    if smoke:
        return dict.fromkeys(("exact", "wildcard", "tag", "soft"), 1)
    c = {"exact": 100, "wildcard": 20, "tag": 20, "soft": 20}
    if files < 10000:
        c = {"exact": 20, "wildcard": 5, "tag": 5, "soft": 5}
    for row in c:
        if (name, row) in WALKS:
            c[row] = 20 if files <= 10000 else (5 if files <= 100000 else 3)
    return c


class Target:
    """One target's nginx (and esid) over its own copy of the zone."""

    def __init__(self, args, bench, name, zone):
        self.args = args
        self.b = bench
        self.name = name
        self.zone = zone
        self.nginx = None
        self.port = None
        self.esid = None
        self.socket = os.path.join(bench.tmp, "esid-%s.sock" % zone.name)
        self.dir = "nginx-%s-%s" % (name, zone.name)
        self.errlog = os.path.join(bench.tmp, self.dir, "error.log")
        self.started = None
        self.at = 0               # where this nginx's log starts

    def module(self):
        if self.name == "ours":
            return os.path.join(self.args.build_dir, "ngx_http_esi_module.so")
        return self.args.peer_modules[self.name.replace("_vary", "")]

    def http(self):
        z = self.zone
        index = "%dm" % max(64, math.ceil(z.files * 400 / 2 ** 20))
        c = CONF[self.name]
        text = fill(purge.HTTP, {
            "CACHE_PATHS": CACHE_PATH, "ARM_HTTP": c["HTTP_EXTRA"],
            "LOCATIONS": fill(purge.ZONE_LOCATION, {"PURGE": c["PURGE"]},
                              strict=False) + fill(ALL_LOCATION, {
                                  "PURGE_ALL": c["PURGE_ALL"]},
                                  strict=False) + c["LOCATIONS"]},
            strict=False)
        return fill(text, {"PATH": z.path, "ZONE": z.name,
                           "MB": str(z.keys_zone_mb), "SOCKET": self.socket,
                           "INDEX": index}, strict=False)

    def modules(self):
        # cache_pilot hands its wildcard walks to the "default" pool.
        return "load_module %s;\nthread_pool default threads=4;" % \
            self.module()

    def start(self):
        if self.name == "ours" and self.esid is None:
            self.esid = self.b.esid("esid-" + self.zone.name, self.socket,
                                    "--log-level", "info")
        self.started = time.monotonic()
        self.at = os.path.getsize(self.errlog) if \
            os.path.exists(self.errlog) else 0
        self.nginx, self.port = self.b.nginx(self.dir, self.http(),
                                             self.modules(), "info")

    def stop(self):
        if self.nginx is not None:
            self.nginx.stop()
            self.b.procs.remove(self.nginx)
            self.nginx = None

    def alive(self):
        return self.nginx is not None and self.nginx.alive()

    def log_text(self, since=None):
        """The error log since this nginx started (or `since`)."""
        with open(self.errlog, "rb") as f:
            f.seek(self.at if since is None else since)
            return f.read().decode("utf-8", "replace")

    def wait_loader(self, bound):
        """Until NGINX's cache loader has loaded the zone (it starts 60 s
        after nginx does); seconds since the start, or None."""
        if not poll(lambda: "http file cache: " in self.log_text(), bound,
                    0.2):
            return None
        return time.monotonic() - self.started

    def wait_ready(self, bound):
        """Until the target's own index says it is complete (esid's
        `esictl zones`, cache_pilot's stats): seconds since the start, or
        None."""
        if self.name == "ours":
            def ready():
                r = subprocess.run(
                    [os.path.join(self.args.build_dir, "esictl"), "--socket",
                     self.socket, "zones", "--json"], capture_output=True,
                    text=True)
                z = json.loads(r.stdout or "{}").get(self.zone.name) \
                    if r.returncode == 0 else None
                return bool(z and z["complete"] and not z["scanning"])
        else:
            def ready():
                client = Client(self.port, 10)
                try:
                    _, _, body = client.request("GET", "/_stats")
                    z = json.loads(body)["zones"][self.zone.name]
                    return z.get("index", {}).get("state") == "ready"
                except (OSError, ValueError, KeyError):
                    return False
                finally:
                    client.close()
        if not poll(ready, bound, 0.2):
            return None
        return time.monotonic() - self.started

    def memory(self):
        """VmRSS in KiB: the workers together, esid."""
        w = sum(memory_kib(p)["VmRSS"] for p in worker_pids(self.nginx.pid))
        e = memory_kib(self.esid.pid)["VmRSS"] if self.esid else None
        return {"workers_kib": w, "esid_kib": e}

    # -- the requests, as each target takes them ------------------------

    def request(self, client, row, key):
        """(ms, status, body) of one purge of `row`'s kind of `key`."""
        headers = {}
        method, path = "PURGE", key
        if self.name.startswith("cache_purge"):
            method, path = "GET", "/cp" + key
        if row == "wildcard":
            path += "*"
        elif row == "tag":
            tag = tag_of(key.encode()).decode()
            path = "/%s/" % self.zone.name
            headers = {"X-Magento-Tags" if self.name == "cache_pilot" else
                       "Surrogate-Key": tag}
        elif row == "soft":
            headers = {"X-Purge-Mode": "soft"} if \
                self.name == "cache_pilot" else {"Fastly-Soft-Purge": "1"}
        elif row == "all":
            method, path = "PURGE", "/all/" + self.zone.name
        ms, status, _, body = client.timed(method, path, headers)
        return ms, status, body


# -- the rows -----------------------------------------------------------------

def take_leaf(zone):
    """A Vary'd key still on disk that no other key starts with (its
    number times ten is past the last one), for a wildcard of one key."""
    for i in range(len(zone.unused) - 1, -1, -1):
        if zone.unused[i] * 10 >= zone.vary:
            return vary_key(zone.name, zone.unused.pop(i))
    raise RuntimeError("%s: out of leaf keys" % zone.name)


def series(t, row, n, intervals):
    """n purges of `row`'s kind, each of a fresh Vary'd key; returns the
    row's result: latencies, files each removed (of 2), wrong answers."""
    client = Client(t.port, 600)
    ms, removed, wrong, keys = [], [], [], []
    for _ in range(n):
        key = take_leaf(t.zone) if row == "wildcard" else t.zone.take()
        time.sleep(0.005)
        t0 = time.perf_counter()
        took, status, _ = t.request(client, row, key.decode())
        intervals.append(("scan", t0, time.perf_counter()))
        ms.append(took)
        left = t.zone.on_disk(key)
        removed.append(2 - left)
        keys.append(key)
        want = 2 if row == "soft" else 0
        if status not in (200, 202) or left != want:
            wrong.append("%s: %d, %d of 2 files left" % (key.decode(),
                                                        status, left))
    if row == "soft":
        # Stale, not gone: each variant must now be fetched again.
        for key in keys:
            for value in purge.VARIANTS:
                h = {"Accept-Encoding": value.decode()} if value else {}
                _, hd, _ = client.request("GET", key.decode(), h)
                if hd.get("x-cache-status") not in ("EXPIRED", "STALE",
                                                     "UPDATING"):
                    wrong.append("%s (Accept-Encoding %r) after a soft "
                                 "purge: %s" % (key.decode(), value,
                                                hd.get("x-cache-status")))
    client.close()
    return dict(summary(ms), removed=sum(removed) / len(removed),
                wrong=wrong)


def storm(t, rate, seconds, intervals, connections=16):
    """Exact purges of plain keys (not the probe's) at `rate` a second,
    scheduled ahead (open loop) over `connections` keep-alive
    connections."""
    z = t.zone
    probe = set(z.probe)
    keys = [plain_key(z.name, i) for i in range(z.plain)]
    keys = [k for k in keys if k not in probe][:int(rate * seconds)]
    results = [None] * len(keys)
    t0 = time.perf_counter() + 0.1

    def run(first):
        c = Client(t.port, 600)
        for i in range(first, len(keys), connections):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                ms, status, _ = t.request(c, "exact", keys[i].decode())
            except OSError as e:
                ms, status = float("nan"), str(e)
                c.close()
            results[i] = (ms, status)
        c.close()

    threads = [threading.Thread(target=run, args=(i,))
               for i in range(connections)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    end = time.perf_counter()
    intervals.append(("scan", t0, end))
    ms = [r[0] for r in results if r[1] == 200]
    left = sum(1 for k in keys if os.path.exists(os.path.join(
        z.path, files_of(k, False)[0])))
    bad = sum(1 for r in results if r[1] != 200)
    wrong = []
    if bad:
        wrong.append("%d of %d answered other than 200" % (bad, len(keys)))
    if left:
        wrong.append("%d of %d files left" % (left, len(keys)))
    return dict(summary(ms), removed=(len(keys) - left) / len(keys),
                rate=len(keys) / (end - t0), wrong=wrong)


def restart(t, bound):
    """nginx stopped and started again; exact purges of fresh Vary'd keys
    from its start, one every 0.25 s (1 s after the first 10 s), until one
    removes both files: seconds from the start, or None within `bound`."""
    t.stop()
    t.start()
    client = Client(t.port, 600)
    tries = 0
    before = {}    # (status, files left) -> purges until the first right one
    try:
        while time.monotonic() - t.started < bound:
            key = t.zone.take()
            _, status, _ = t.request(client, "exact", key.decode())
            tries += 1
            left = t.zone.on_disk(key)
            if left == 0:
                return {"seconds": time.monotonic() - t.started,
                        "tries": tries, "wrong": [], "before": before}
            before[status, left] = before.get((status, left), 0) + 1
            time.sleep(0.25 if time.monotonic() - t.started < 10 else 1)
    finally:
        client.close()
    return {"seconds": None, "tries": tries, "before": before,
            "wrong": ["no exact purge removed both files within %d s "
                      "(%d tried)" % (bound, tries)]}


def wrong_before(rs):
    """What the purges before the first right one answered: "91 x 200 with
    1 of 2 files left"."""
    return ", ".join("%d x %s with %d of 2 files left" % (n, st, left)
                     for (st, left), n in sorted(rs["before"].items()))


def purge_all(t):
    """One purge of everything in the zone; no file may be left."""
    client = Client(t.port, 3600)
    ms, status, _ = t.request(client, "all", "")
    client.close()
    left = sum(len(f) for _, _, f in os.walk(t.zone.path))
    wrong = [] if status in (200, 202) and not left else [
        "status %d, %d of %d files left" % (status, left, t.zone.files)]
    return dict(summary([ms]), removed=1 - left / t.zone.files, wrong=wrong)


def measure_target(args, bench, name, zone):
    """Every row `name` can do on its own copy of `zone`."""
    res = {"name": name}
    t = Target(args, bench, name, zone)
    zone.generate(args.gen_jobs if zone.files >= 100000 else 1)
    t.start()
    log("%s %s: nginx on 127.0.0.1:%d" % (zone.name, name, t.port))
    if not args.smoke:
        # Each index as soon as it is complete, then the loader.
        if name in ("ours", "cache_pilot"):   # ngx_cache_purge has none
            res["ready_s"] = t.wait_ready(600 + zone.files / 500)
        res["loader_s"] = t.wait_loader(120 + zone.files / 1000)
        log("%s %s: loader done after %s s, index ready after %s s" % (
            zone.name, name, res["loader_s"], res.get("ready_s")))
    c = counts_for(zone.files, args.smoke, name)
    probe = Probe(t.port, zone.probe, args.probe_interval / 1000)
    intervals = {}
    gc.disable()
    probe.start()
    try:
        for row in ("exact", "wildcard", "tag", "soft", "storm"):
            if row not in CAN[name]:
                continue
            if not t.alive():
                res[row] = {"wrong": ["nginx died"], "n": 0}
                continue
            iv = intervals.setdefault(row, [])
            time.sleep(0.3)   # some probe samples at rest between rows
            try:
                if row == "storm":
                    res[row] = storm(t, args.storm_rate,
                                     0.5 if args.smoke else
                                     args.storm_seconds, iv)
                else:
                    res[row] = series(t, row, c[row], iv)
            except (OSError, RuntimeError) as e:
                res[row] = {"wrong": ["%s" % e], "n": 0}
            r = res[row]
            log("%s %s %s: %s" % (zone.name, name, row, describe(r)))
        time.sleep(0.3)
    finally:
        probe.stop()
        gc.enable()
    flat = [x for iv in intervals.values() for x in iv]
    res["probe"] = {"rest": summary(classify(probe.samples, flat)["rest"]),
                    "errors": sum(1 for x in probe.samples if not x[2]),
                    "requests": len(probe.samples)}
    for row, iv in intervals.items():
        res["probe"][row] = summary(classify(probe.samples, iv)["scan"])
    if t.alive():
        res["memory"] = t.memory()
    if "restart" in CAN[name] and not args.smoke and t.alive():
        res["restart"] = restart(t, 75 + zone.files / 2000)
        log("%s %s restart: %s" % (zone.name, name, res["restart"]))
    if "all" in CAN[name]:
        res["all"] = purge_all(t) if t.alive() else {
            "wrong": ["nginx died"], "n": 0}
        log("%s %s all: %s" % (zone.name, name, describe(res["all"])))
    res["alive"] = t.alive()
    # A worker that crashed is respawned: only the master's log says so.
    res["crashes"] = t.log_text(0).count("exited on signal")
    t.stop()
    return res


def describe(r):
    if not r.get("n"):
        return "; ".join(r.get("wrong", [])) or "n/a"
    s = "p50 %s ms, p99 %s ms (%d), %.2f removed" % (
        fmt_ms(r["p50"]), fmt_ms(r["p99"]), r["n"], r["removed"])
    if "rate" in r:
        s += ", %.0f/s" % r["rate"]
    return s + ("; WRONG: " + "; ".join(r["wrong"][:3]) if r["wrong"]
                else "")


# -- results ------------------------------------------------------------------

def cell(r):
    """A table cell: p50 / p99 ms, or what went wrong."""
    if r is None:
        return "cannot"
    if not r.get("n"):
        return "**failed**: " + "; ".join(r.get("wrong", []))[:120]
    s = "%s / %s" % (fmt_ms(r["p50"]), fmt_ms(r["p99"]))
    if r["n"] == 1:
        s = fmt_ms(r["p50"])
    if "rate" in r:
        s += " at %.0f/s" % r["rate"]
    if r["wrong"]:
        s += " **wrong %d of %d**" % (len(r["wrong"]), r["n"]) if \
            len(r["wrong"]) <= r["n"] else " **wrong**"
    return s


def ratio(peer, ours):
    try:
        v = peer["p50"] / ours["p50"]
    except (TypeError, KeyError, ZeroDivisionError):
        return "n/a"
    if peer.get("wrong"):
        return "(%s, wrong)" % purge.ratio_(peer["p50"], ours["p50"])
    return purge.ratio_(peer["p50"], ours["p50"]) if v == v else "n/a"


def markdown(args, info, sizes, res, meta):
    L = ["## purge against the NGINX purge modules, %s" %
         meta["started"].strftime("%Y-%m-%d %H:%M"), ""]
    L.append("Machine: %(nproc)d cores, %(cpu)s, %(memory)s, Linux "
             "%(kernel)s; nginx %(nginx)s. Measured: %(product)s." % info +
             " Load average %s before, %s after; run took %d s. Each target "
             "in an nginx of its own (`worker_processes 1`) over its own copy "
             "of the zone, on %s; purges one at a time on one keep-alive "
             "connection (the storm: 16), a probe of cache HITs every %g ms "
             "on the same worker throughout." % (
                 meta["load_before"], meta["load_after"], meta["elapsed"],
                 meta["fs"], args.probe_interval))
    if args.smoke:
        L.append("")
        L.append("**Smoke**: one purge a row, no wait for the cache loader "
                 "or the indexes; correctness only, no figure to quote.")
    for label in sizes:
        files = SIZES[label]
        r = res[label]
        present = [t for t in TARGETS if t in r]
        L += ["", "### %s files: purge latency, ms p50 / p99" %
              "{:,}".format(files), ""]
        purge.table_head(L, "| row | " + " | ".join(
            LABEL[t] for t in present) + " | " + " | ".join(
            "%s / ours" % SHORT[t] for t in present
            if t != "ours") + " |", "l" + "r" * (2 * len(present) - 1))
        for row in ROWS:
            if row == "restart":
                continue
            cells = [cell(r[t].get(row)) for t in present]
            ratios = [ratio(r[t].get(row) or {}, r["ours"].get(row) or {})
                      for t in present if t != "ours"]
            L.append("| %s | %s | %s |" % (row, " | ".join(cells),
                                             " | ".join(ratios)))
        L += ["", "Files removed per purge (exact, wildcard, tag: of the "
              "key's 2; soft: of 2 kept; storm, all: share of the files), "
              "checked on disk:", ""]
        purge.table_head(L, "| row | " + " | ".join(
            LABEL[t] for t in present) + " |", "l" + "r" * len(present))
        for row in ROWS:
            if row == "restart":
                continue
            vals = []
            for t in present:
                x = r[t].get(row)
                if x is None:
                    vals.append("cannot")
                elif not x.get("n"):
                    vals.append("failed")
                else:
                    v = x["removed"] if row != "soft" else 2 - x["removed"]
                    vals.append(("%.2f" % v) + (" **wrong**" if x["wrong"]
                                                else ""))
            L.append("| %s | %s |" % (row, " | ".join(vals)))
        L += ["", "GETs on the same worker (the probe), ms p99 (samples); "
              "during a row against at rest:", ""]
        purge.table_head(L, "| target | at rest | during exact | during "
                         "storm | storm / rest | failed GETs |", "lrrrrr")
        for t in present:
            p = r[t].get("probe")
            if not p:
                continue
            ex, st, rest = p.get("exact"), p.get("storm"), p["rest"]

            def pc(s):
                return "%s (%d)" % (fmt_ms(s["p99"]), s["n"]) if s and \
                    s["n"] else "n/a"
            L.append("| %s | %s | %s | %s | %s | %d of %d |" % (
                LABEL[t], pc(rest), pc(ex), pc(st),
                purge.ratio_(st["p99"], rest["p99"]) if st and st["n"]
                else "n/a", p["errors"], p["requests"]))
        L += ["", "Memory after the storm, and after a restart of nginx "
              "(esid left running) how long until an exact purge of a "
              "Vary'd key removed both files:", ""]
        purge.table_head(L, "| target | workers' VmRSS | esid's VmRSS | "
                         "loader done | index ready | restart: correct "
                         "after | workers crashed | nginx alive at the end "
                         "|", "lrrrrrrl")
        for t in present:
            m = r[t].get("memory") or {}
            rs = r[t].get("restart")
            rcell = "cannot" if "restart" not in CAN[t] else (
                "not measured" if rs is None else
                ("%.2f s (%d purge%s)" % (rs["seconds"], rs["tries"],
                                          "" if rs["tries"] == 1 else "s")
                 if rs["seconds"] is not None else "**never**: " +
                 rs["wrong"][0]))
            if rs and rs["before"]:
                rcell += "; before: **%s**" % wrong_before(rs)

            def sec(v):
                return "n/a" if v is None else "%.1f s" % v
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                LABEL[t], "%s KiB" % "{:,}".format(m["workers_kib"])
                if m else "n/a",
                "%s KiB" % "{:,}".format(m["esid_kib"]) if m.get("esid_kib")
                else "-", sec(r[t].get("loader_s")),
                sec(r[t].get("ready_s")) if t in ("ours", "cache_pilot")
                else "no index", rcell,
                "**%d**" % r[t]["crashes"] if r[t]["crashes"] else "0",
                "yes" if r[t]["alive"] else "**no**"))
    wrongs = [(label, t, row, w) for label in sizes
              for t in TARGETS if t in res[label]
              for row in ROWS
              for w in ((res[label][t].get(row) or {}).get("wrong") or [])[:3]]
    if wrongs:
        L += ["", "Wrong answers and failures (first 3 of each row):", ""]
        for label, t, row, w in wrongs:
            L.append("- %s, %s, %s: %s" % (label, LABEL[t], row, w))
    L.append("")
    return "\n".join(L)


def write_csv(path, sizes, res):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["files", "target", "row", "n", "p50_ms", "p99_ms",
                    "max_ms", "removed", "rate", "wrong"])
        for label in sizes:
            for t in TARGETS:
                r = res[label].get(t)
                if not r:
                    continue
                for row in ROWS:
                    x = r.get(row)
                    if x is None or row == "restart":
                        continue
                    w.writerow([SIZES[label], t, row, x.get("n", 0),
                                "%.3f" % x["p50"] if x.get("n") else "",
                                "%.3f" % x["p99"] if x.get("n") else "",
                                "%.3f" % x["max"] if x.get("n") else "",
                                "%.3f" % x["removed"] if x.get("n") else "",
                                "%.0f" % x["rate"] if "rate" in x else "",
                                "; ".join(x.get("wrong", []))[:500]])
                for k, s in r.get("probe", {}).items():
                    if isinstance(s, dict) and s.get("n"):
                        w.writerow([SIZES[label], t, "probe_" + k, s["n"],
                                    "%.3f" % s["p50"], "%.3f" % s["p99"],
                                    "%.3f" % s["max"], "", "", ""])
                rs = r.get("restart")
                if rs:
                    w.writerow([SIZES[label], t, "restart_s", rs["tries"],
                                "" if rs["seconds"] is None else
                                "%.3f" % rs["seconds"], "", "", "", "",
                                "; ".join(rs["wrong"] + (
                                    ["before: " + wrong_before(rs)]
                                    if rs["before"] else []))])
                m = r.get("memory") or {}
                for k, v in m.items():
                    if v is not None:
                        w.writerow([SIZES[label], t, k, "", v, "", "", "",
                                    "", ""])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--peers", required=True,
                   help="directory of the built peer modules "
                   "(bench/build-peers.sh's OUT_DIR)")
    p.add_argument("--product", default="?")
    p.add_argument("--sizes", default="10k,100k,1m")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--storm-rate", type=float, default=1000)
    p.add_argument("--storm-seconds", type=float, default=5)
    p.add_argument("--probe-interval", type=float, default=1.0)
    p.add_argument("--gen-jobs", type=int, default=2)
    p.add_argument("--nice", type=int, default=-10)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--no-mount", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    args.peers = os.path.abspath(args.peers)
    args.peer_modules = {
        "cache_purge": os.path.join(args.peers, "ngx_cache_purge-3.0.1",
                                    "ngx_http_cache_purge_module.so"),
        "cache_pilot": os.path.join(args.peers, "ngx_cache_pilot-2.0.0",
                                    "ngx_http_cache_pilot_module.so")}
    for f in list(args.peer_modules.values()) + [
            os.path.join(args.build_dir, x) for x in
            ("esid", "esictl", "ngx_http_esi_module.so")]:
        if not os.path.exists(f):
            p.error("%s missing" % f)
    if args.smoke:
        args.sizes = "1k"
        args.no_mount = args.no_readme = True
    args.workers = "1"
    sizes = [s.strip().lower() for s in args.sizes.split(",") if s.strip()]
    targets = [t for t in args.targets.split(",") if t]
    for s in sizes:
        if s not in SIZES:
            p.error("unknown size %s" % s)
    if "ours" not in targets or any(t not in TARGETS for t in targets):
        p.error("targets: ours and any of %s" % ", ".join(TARGETS))

    exit_on_signals()
    started = datetime.datetime.now()
    t_start = time.monotonic()
    load_before = loadavg()
    res, fs_label = {}, ""
    if args.nice and not args.smoke:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as e:
            log("cannot set niceness %d: %s" % (args.nice, e))
    for label in sizes:
        res[label], fs_label = measure_size(args, label, targets)
    meta = {"started": started, "elapsed": time.monotonic() - t_start,
            "load_before": load_before, "load_after": loadavg(),
            "fs": fs_label}
    md = markdown(args, machine_info(args), sizes, res, meta)
    print()
    print(md)
    ours_wrong = [(label, row) for label in sizes
                  for row in ROWS
                  if (res[label]["ours"].get(row) or {}).get("wrong")]
    dead = [(label, t) for label in sizes for t in res[label]
            if not res[label][t]["alive"]]
    if ours_wrong or dead:
        log("ours wrong in %s; nginx died: %s" % (ours_wrong, dead))
    if not args.smoke:
        os.makedirs(args.results, exist_ok=True)
        base = os.path.join(args.results, "%s-purge-peers" %
                            started.strftime("%Y-%m-%d"))
        with open(base + ".md", "w") as f:
            f.write(md)
        write_csv(base + ".csv", sizes, res)
        log("results: %s.md, %s.csv" % (base, base))
        if not args.no_readme:
            update_readme(md, [], marker="purge-peers", raw=(base + ".csv",))
    # A peer's wrong answer or crash is a result; ours is a failure.
    return 1 if ours_wrong or ("ours" in [t for _, t in dead]) else 0


def measure_size(args, label, targets):
    """Every target over its own copy of a `label` zone, on one file
    system; returns ({target: result}, file system label)."""
    with purge.zone_space(args, SIZES[label] * len(targets)) as (
            bench, root, fs_label):
        out = {}
        for name in targets:
            zone = Zone(label, SIZES[label], os.path.join(root, name))
            out[name] = measure_target(args, bench, name, zone)
        return out, fs_label

if __name__ == "__main__":
    sys.exit(main())
