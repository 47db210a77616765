#!/usr/bin/env python3
"""The soak behind `bench/soak.sh` (issue #23, item 5).

One NGINX (the module, two workers, a proxy_cache, `esi on` alone: plans
and gzip stitching by default, `esi_cache_purge PURGE`), its esid and an
origin NGINX serving PAGES pages of 8 to 64 KB, each with three uncached
fragments and an `xkey` tag of one of TAGS groups.  For --duration
seconds:

  traffic   --clients keep-alive clients at --rate requests a second in
            all: pages (four in five; half of them asking for gzip) and
            fragments; every body is checked: the assembled page, or the
            raw one (esid away), or counted as other
  purges    an exact PURGE of a random page every second, a PURGE by tag
            (`xkey: gN`) every 10 s
  restarts  esid stopped (SIGTERM) and started again every
            --restart-every seconds; the workers reconnect
  samples   every --interval seconds (10): VmRSS and RssAnon of every
            nginx worker and of esid, their open fds, esid's counters
            (streams open, ring bytes each way, answers that waited for
            ring space, workers that waited for room, segment pins) and
            the default plan zone's bytes and entries; into
            results/DATE-soak.csv and a gnuplot plot of it

At the end, the growth after warm-up: a least-squares line through the
samples after --warmup seconds, its slope as a share of the mean per
hour.  esid's memory, and the workers' VmRSS (which counts the pages of
esid's rings and segment arena they have touched), start again with each
esid: their lines have one intercept per esid life and leave out the
first --warmup seconds of each; the workers' RssAnon (their own heap)
is one line over the whole run after --warmup.  Goal: under 1% an hour
for each; the script prints each and whether it holds.
Exit status 1 when a process died, a request failed or a goal was missed.

Everything started here is stopped on the way out, also on failure.
"""

import argparse
import csv
import datetime
import gzip
import json
import os
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reporting  # noqa: E402
import support_path  # noqa: E402,F401  (tests/support on sys.path)
from esitest import memory_kib, open_fds, poll, worker_pids  # noqa: E402
from purge import Client  # noqa: E402
from running import Servers, exit_on_signals, loadavg  # noqa: E402
from workload import esi_tag, fragment_body, shell_filler  # noqa: E402

PAGES = 200
TAGS = 10
FRAGMENTS_PER_PAGE = 3
GOAL_PERCENT_PER_HOUR = 1.0

ORIGIN_HTTP = """\
    access_log off;
    map $uri $page_tag {
        ~^/p/(?<group>[0-9]+)- g$group;
    }
    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        root @@DIR@@/www;
        location /p/ {
            add_header xkey $page_tag;
        }
        location /f/ {
            return 200 '<div class="frag">$uri</div>\\n';
        }
    }
"""

TARGET_HTTP = """\
    access_log off;
    esi_daemon unix:@@SOCKET@@;
    upstream origin {
        server 127.0.0.1:@@ORIGIN@@;
        keepalive 32;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Accept-Encoding "";
    proxy_cache_path @@DIR@@/cache levels=1:2 keys_zone=pages:16m;
    gzip on;

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        location /p/ {
            proxy_pass http://origin;
            proxy_cache pages;
            proxy_cache_valid 200 1h;
            proxy_cache_key $uri$is_args$args;
            esi on;
            esi_cache_purge PURGE from 127.0.0.1;
        }
        location /f/ {
            proxy_pass http://origin;
            esi on;
        }
    }
"""


def log(msg):
    reporting.log("soak: " + msg)


def page_path(i):
    return "/p/%d-%d.html" % (i % TAGS, i)


def write_pages(www):
    """The origin's pages; returns {path: (raw, assembled)}."""
    rng = random.Random(23)
    os.makedirs(os.path.join(www, "p"), exist_ok=True)
    pages = {}
    for i in range(PAGES):
        path = page_path(i)
        parts = [shell_filler(rng.randint(8, 64) * 1024 // 4, rng)
                 for _ in range(FRAGMENTS_PER_PAGE + 1)]
        frags = ["/f/%d/%d" % (i, k) for k in range(FRAGMENTS_PER_PAGE)]
        raw = parts[0] + b"".join(esi_tag(f) + p
                                  for f, p in zip(frags, parts[1:]))
        whole = parts[0] + b"".join(fragment_body(f) + p
                                    for f, p in zip(frags, parts[1:]))
        with open(os.path.join(www, path.lstrip("/")), "wb") as f:
            f.write(raw)
        pages[path] = (raw, whole)
    return pages


# -- the run ------------------------------------------------------------------

class Soak:
    def __init__(self, args):
        self.args = args
        self.servers = Servers(args)
        self.esictl_path = os.path.join(args.build_dir, "esictl")
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "whole": 0, "raw": 0, "other": 0,
                       "failed": 0, "purges": 0, "purged": 0,
                       "tag_purges": 0, "tag_purged": 0, "restarts": 0}
        self.problems = []
        self.stopping = threading.Event()

    def count(self, name, n=1):
        with self.lock:
            self.counts[name] += n

    def problem(self, what):
        with self.lock:
            if len(self.problems) < 20:
                self.problems.append(what)

    def start(self):
        s = self.servers
        self.pages = write_pages(os.path.join(s.tmp, "origin", "www"))
        _, self.origin_port = s.nginx("origin", ORIGIN_HTTP.replace(
            "@@DIR@@", os.path.join(s.tmp, "origin")))
        self.socket = os.path.join(s.tmp, "esid.sock")
        self.start_esid()
        module = os.path.join(self.args.build_dir, "ngx_http_esi_module.so")
        http = (TARGET_HTTP.replace("@@SOCKET@@", self.socket)
                .replace("@@ORIGIN@@", str(self.origin_port))
                .replace("@@DIR@@", os.path.join(s.tmp, "esi")))
        self.nginx, self.port = s.nginx("esi", http,
                                        "load_module %s;" % module)
        self.workers = poll(lambda: (lambda w: w if len(w) == int(
            self.args.workers) else None)(worker_pids(self.nginx.pid)))
        if not self.workers:
            raise RuntimeError("nginx's workers did not start")
        log("origin on %d, nginx on %d (workers %s), esid pid %d" % (
            self.origin_port, self.port, self.workers, self.esid.pid))

    def esid_options(self):
        """Options of each esid this run starts, beyond its socket."""
        return ["--log-level", "warn"]

    def start_esid(self):
        self.esid = self.servers.esid("esid", self.socket,
                                      *self.esid_options())
        self.esid_started = time.monotonic()

    def restart_esid(self):
        old = self.esid
        old.stop()
        self.servers.procs.remove(old)
        if old.popen.returncode != 0:
            self.problem("esid %d exited %s on SIGTERM" % (
                old.pid, old.popen.returncode))
        self.start_esid()
        self.count("restarts")
        log("esid restarted: pid %d" % self.esid.pid)

    def esictl(self, *args):
        r = subprocess.run([self.esictl_path, "--socket", self.socket]
                           + list(args), capture_output=True, text=True,
                           timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    # -- the clients ----------------------------------------------------------

    def client(self, n):
        rng = random.Random(n)
        conn = Client(self.port, timeout=30)
        paths = list(self.pages)
        every = self.args.clients / self.args.rate
        next_at = time.monotonic() + rng.random() * every
        while not self.stopping.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            next_at += every
            headers = {"Accept-Encoding": "gzip"} if rng.random() < 0.5 \
                else {}
            if rng.random() < 0.8:
                path = rng.choice(paths)
                expected = self.pages[path]
            else:
                path = "/f/%d/%d" % (rng.randrange(PAGES),
                                     rng.randrange(FRAGMENTS_PER_PAGE))
                expected = (fragment_body(path),)
            try:
                status, hdrs, body = conn.request("GET", path, headers)
                if hdrs.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
            except (OSError, EOFError, ValueError) as e:
                conn.close()
                self.count("failed")
                self.problem("GET %s: %s" % (path, e))
                continue
            self.count("requests")
            if status != 200:
                self.count("failed")
                self.problem("GET %s: status %d" % (path, status))
            elif body == expected[-1]:
                self.count("whole")
            elif body == expected[0]:
                self.count("raw")
            else:
                self.count("other")
        conn.close()

    def purger(self):
        rng = random.Random(-1)
        conn = Client(self.port, timeout=60)
        k = 0
        # On a fixed beat, as the samples are: a period of a second plus a
        # PURGE's round trip slid the tag purges across the samples, and
        # the plan zone's entries, which dip by the group a tag purge
        # removes until its pages are asked for twice, read as a drift.
        next_at = time.monotonic()
        while True:
            next_at += 1.0
            if self.stopping.wait(max(0.0, next_at - time.monotonic())):
                break
            k += 1
            if k % 10:
                what, headers = rng.choice(list(self.pages)), {}
                name = "purges"
            else:
                what = page_path(0)
                headers = {"xkey": "g%d" % rng.randrange(TAGS)}
                name = "tag_purges"
            try:
                status, hdrs, _ = conn.request("PURGE", what, headers)
            except OSError as e:
                conn.close()
                self.problem("PURGE %s %s: %s" % (what, headers, e))
                continue
            result = hdrs.get("cache-purge-result", "")
            if status not in (200, 404) or "count=" not in result:
                self.problem("PURGE %s %s: %d %r" % (what, headers, status,
                                                     result))
                continue
            self.count(name)
            self.count(name.replace("purges", "purged"),
                       int(result.rsplit("count=", 1)[1].split(";")[0]))
        conn.close()

    # -- the samples ----------------------------------------------------------

    def sample(self, t):
        stats = self.esictl("stats", "--json") or {}
        plans = (self.esictl("plans", "--json") or {}).get("default", {})
        esid = memory_kib(self.esid.pid)
        row = {"t": round(t, 1), "esid_pid": self.esid.pid,
               "esid_rss_kib": esid["VmRSS"],
               "esid_anon_kib": esid["RssAnon"],
               "esid_fds": len(open_fds(self.esid.pid))}
        total = anon = fds = 0
        for i, pid in enumerate(self.workers):
            m = memory_kib(pid)
            row["worker%d_rss_kib" % i] = m["VmRSS"]
            total += m["VmRSS"]
            anon += m["RssAnon"]
            fds += len(open_fds(pid))
        row.update({"workers_rss_kib": total, "workers_anon_kib": anon,
                    "workers_fds": fds})
        for name in ("active_connections", "active_streams",
                     "ring_bytes_in", "ring_bytes_out", "ring_used_requests",
                     "ring_used_responses", "ring_full", "worker_waits",
                     "segment_pins"):
            row[name] = stats.get(name, "")
        row["plan_bytes"] = plans.get("bytes", "")
        row["plan_entries"] = plans.get("entries", "")
        with self.lock:
            row.update({k: self.counts[k] for k in ("requests", "failed")})
        return row

    def run(self):
        a = self.args
        threads = [threading.Thread(target=self.client, args=(n,),
                                    daemon=True) for n in range(a.clients)]
        threads.append(threading.Thread(target=self.purger, daemon=True))
        for th in threads:
            th.start()
        t0 = time.monotonic()
        next_restart = t0 + a.restart_every
        samples = []
        try:
            while True:
                now = time.monotonic()
                if now - t0 >= a.duration:
                    break
                if a.restart_every and now >= next_restart:
                    self.restart_esid()
                    next_restart += a.restart_every
                row = self.sample(now - t0)
                row["esid_age"] = round(now - self.esid_started, 1)
                samples.append(row)
                log("t=%4.0f s  workers %s KiB (%d fds)  esid %d KiB (%d fds)"
                    "  plans %s B  streams %s  requests %d" % (
                        row["t"], "+".join(str(row["worker%d_rss_kib" % i])
                                           for i in range(len(self.workers))),
                        row["workers_fds"], row["esid_rss_kib"],
                        row["esid_fds"], row["plan_bytes"],
                        row["active_streams"], row["requests"]))
                for pid in self.workers:
                    if not os.path.exists("/proc/%d" % pid):
                        self.problem("worker %d died" % pid)
                if not self.esid.alive():
                    self.problem("esid %d died" % self.esid.pid)
                    break
                time.sleep(max(0.0, t0 + len(samples) * a.interval
                               - time.monotonic()))
        finally:
            self.stopping.set()
            for th in threads:
                th.join(60)
        if sorted(worker_pids(self.nginx.pid)) != sorted(self.workers):
            self.problem("the workers changed: %s, now %s" % (
                self.workers, worker_pids(self.nginx.pid)))
        return samples


# -- growth -------------------------------------------------------------------

def growth(samples, key, warmup, life=None):
    """% per hour of a least-squares line through samples[key] after
    `warmup` s (of the run, or with `life` of each value of samples[life]:
    one intercept per group), with the mean; None without two samples."""
    groups = {}
    for row in samples:
        age = row["esid_age"] if life else row["t"]
        if age >= warmup:
            groups.setdefault(row[life] if life else 0, []).append(
                (row["t"], float(row[key])))
    sxx = sxy = total = n = 0.0
    for points in groups.values():
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        sxx += sum((x - mx) ** 2 for x, _ in points)
        sxy += sum((x - mx) * (y - my) for x, y in points)
        total += sum(y for _, y in points)
        n += len(points)
    if sxx == 0 or n < 2 or total == 0:
        return None
    mean = total / n
    return sxy / sxx * 3600 / mean * 100, mean, int(n)


def plot(png, csv_path, workers):
    def line(column, scale, title, axes=""):
        return ("'%s' using (column('t')):(column('%s')/%d)%s with lines "
                "title '%s'" % (csv_path, column, scale, axes, title))

    lines = [line("worker%d_rss_kib" % i, 1024, "worker %d RSS" % i)
             for i in range(workers)]
    lines.append(line("esid_rss_kib", 1024, "esid RSS"))
    lines.append(line("plan_bytes", 1 << 20, "plan zone (y2)", " axes x1y2"))
    script = """
set terminal pngcairo size 1100,520 noenhanced font ",10"
set output '%s'
set datafile separator ','
set key autotitle columnhead outside right top
set title 'soak: memory over time'
set xlabel 'seconds'
set ylabel 'RSS, MiB'
set y2label 'plan zone, MiB'
set y2tics
set grid
plot %s
""" % (png, ", ".join(lines))
    return png if reporting.gnuplot(script) else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--duration", type=float, default=600,
                   help="seconds (default 600)")
    p.add_argument("--warmup", type=float, default=120,
                   help="seconds left out of the growth fit, of the run "
                   "and of each esid's life (default 120)")
    p.add_argument("--interval", type=float, default=10,
                   help="seconds between samples (default 10)")
    p.add_argument("--restart-every", type=float, default=240,
                   help="seconds between esid restarts (0: none)")
    p.add_argument("--rate", type=float, default=100,
                   help="requests a second, all clients together")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    args.workers = "2"   # running.Servers's nginx

    exit_on_signals()

    started = datetime.datetime.now()
    load_before = loadavg()
    soak = Soak(args)
    ok = False
    try:
        soak.start()
        samples = soak.run()
        os.makedirs(args.results, exist_ok=True)
        base = os.path.join(args.results, "%s-soak" % started.strftime(
            "%Y-%m-%d"))
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(samples[0]))
            w.writeheader()
            w.writerows(samples)
        png = plot(base + ".png", base + ".csv", len(soak.workers))
        c = soak.counts
        log("%d requests (%d assembled, %d raw while esid was away, %d "
            "other, %d failed), %d exact purges removing %d files, %d tag "
            "purges removing %d, %d esid restarts; load average %s, then %s"
            % (c["requests"], c["whole"], c["raw"], c["other"], c["failed"],
               c["purges"], c["purged"], c["tag_purges"], c["tag_purged"],
               c["restarts"], load_before, loadavg()))
        missed = []
        for what, key, life in (
                ("workers' RSS", "workers_rss_kib", "esid_pid"),
                ("workers' RssAnon", "workers_anon_kib", None),
                ("esid's RSS", "esid_rss_kib", "esid_pid"),
                ("esid's RssAnon", "esid_anon_kib", "esid_pid")):
            g = growth(samples, key, args.warmup, life)
            if g is None:
                log("%s: too few samples after warm-up" % what)
                missed.append(what)
                continue
            holds = g[0] < GOAL_PERCENT_PER_HOUR
            log("%s growth after warm-up: %+.2f%% an hour (mean %d KiB, %d "
                "samples): %s" % (what, g[0], g[1], g[2],
                                  "under 1%" if holds else "GOAL MISSED"))
            if not holds:
                missed.append(what)
        for key in ("workers_fds", "esid_fds"):
            values = [r[key] for r in samples]
            log("%s: %d to %d" % (key, min(values), max(values)))
        for x in soak.problems:
            log("problem: " + x)
        log("results: %s.csv%s" % (base, ", " + png if png else ""))
        ok = not soak.problems and not missed and c["failed"] == 0
        return 0 if ok else 1
    finally:
        soak.servers.finish(ok, args.keep)


if __name__ == "__main__":
    sys.exit(main())
