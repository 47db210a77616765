#!/usr/bin/env python3
"""The fleet benchmark behind `bench/run.sh --fleet` (issue #22, item 6).

One redis-server (127.0.0.1, a free port, appendonly yes, in the
temporary directory), one origin (an nginx answering `<p>URI</p>` for any
path, as purge.py's origin location does) and three nodes, each an NGINX
(the module, `worker_processes 1`, a cache directory of its own) and its
esid (a socket of its own, a settings file with `fleet`, `fleet_node`,
`state_dir`), all reading the one stream, as tests/integration/
test_fleet.py sets them up.  Two measurements:

  fan-out  N purges (default 1,000), one at a time, each of a page cached
           at every node beforehand, sent to the nodes in turn (a, b, c, a,
           ...); from the moment the PURGE's answer arrives, the other two
           nodes' cache files (levels=1:2, MD5 of the key: the path is
           known) are polled with stat() until they are gone: the latency
           of each (source, target) pair, p50/p99/max.  The poller records
           the time of the last stat() that still saw the file as well as
           the first that did not, so every figure is bracketed: the
           bracket's width is the precision, printed with the figures.
  rate     purges at a target rate (default 1,000/s, spread over the three
           nodes, two keep-alive connections each) for T seconds (default
           10), of pages cached at every node beforehand; once a second
           each node's `esictl fleet --json` (esid's own lag, and the
           stream's entries added against what the node has processed:
           its backlog) and Redis' INFO (used_memory, CPU, network bytes)
           and XLEN.  Then until every node has processed every entry (the
           drain), and every page purged must be gone at every node.

--smoke: 10 purges and a 1 s rate test; every purge must reach every node
(part of `bench/run.sh --smoke`).  Results: results/DATE-fleet.{md,csv}
and the Fleet section of bench/README.md (full runs, unless --no-readme).

Everything started here is stopped on the way out, also on failure.
"""

import argparse
import csv
import datetime
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reporting  # noqa: E402
import support_path  # noqa: E402,F401  (tests/support on sys.path)
from esitest import fill, free_port, poll  # noqa: E402
from purge import Client, percentile  # noqa: E402
from reporting import fmt, fmt_ms, update_readme  # noqa: E402
from running import (Servers, exit_on_signals, loadavg,  # noqa: E402
                     machine_info)

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
STREAM = "esi:purges"
NAMES = "abcdefghijklmnopqrstuvwxyz"
BATCH = 256   # esid's XREAD COUNT (daemon/fleet/fleet.cc kBatch)

ORIGIN_HTTP = """\
    access_log off;
    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        location / {
            return 200 "<p>$uri</p>\\n";
        }
    }
"""

NODE_HTTP = """\
    access_log off;
    esi_daemon unix:@@SOCKET@@;
    upstream origin {
        server 127.0.0.1:@@ORIGIN@@;
        keepalive 16;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_cache_path @@DIR@@/cache levels=1:2 keys_zone=pages:16m
                     inactive=1d use_temp_path=off;

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_cache pages;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1h;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
            esi_cache_purge PURGE from 127.0.0.1;
        }
    }
"""


def log(msg):
    reporting.log("fleet: " + msg)


# -- Redis, spoken directly (RESP) ---------------------------------------------------

class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def close(self):
        self.sock.close()

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode("utf-8", "replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError("redis: unexpected %r" % line)

    def __call__(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self._reply()

    def info(self):
        out = {}
        for line in self("INFO", "all").splitlines():
            k, sep, v = line.partition(":")
            if sep and not k.startswith("#"):
                out[k] = v
        return out


def redis_answers(port):
    try:
        r = Redis(port)
        try:
            return r("PING") == "PONG"
        finally:
            r.close()
    except OSError:
        return False


# -- the fleet ---------------------------------------------------------------------------

class Node:
    def __init__(self, fleet, name):
        self.fleet = fleet
        self.name = name
        self.dir = os.path.join(fleet.b.tmp, name)
        os.makedirs(self.dir)
        self.socket = os.path.join(self.dir, "esid.sock")
        self.cache = os.path.join(self.dir, "cache")
        self.conf = os.path.join(self.dir, "esid.conf")
        with open(self.conf, "w") as f:
            f.write("fleet = redis://127.0.0.1:%d/0\nfleet_node = %s\n"
                    "state_dir = %s\n" % (fleet.redis_port, name, self.dir))
        self.esid = fleet.b.esid(name + "-esid", self.socket, "--config",
                                 self.conf, "--log-level", "warn")
        http = fill(NODE_HTTP, {"SOCKET": self.socket,
                                "ORIGIN": fleet.origin_port,
                                "DIR": self.dir}, strict=False)
        self.nginx, self.port = fleet.b.nginx(
            name, http, "load_module %s;" % fleet.module)

    def path(self, key):
        h = hashlib.md5(key.encode()).hexdigest()
        return os.path.join(self.cache, h[-1], h[-3:-1], h)

    def esictl(self, *args):
        r = subprocess.run([self.fleet.esictl, "--socket", self.socket] +
                           list(args), capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise RuntimeError("%s: esictl %s: %s" % (
                self.name, " ".join(args), r.stderr.strip()))
        return json.loads(r.stdout)

    def processed(self, stats):
        """Entries of the stream this node is done with."""
        return sum(stats.get("fleet_" + k, 0) for k in
                   ("applied", "own", "skipped", "failed", "refused"))


class Fleet:
    def __init__(self, args, bench):
        self.args = args
        self.b = bench
        self.module = os.path.join(args.build_dir, "ngx_http_esi_module.so")
        self.esictl = os.path.join(args.build_dir, "esictl")
        self.redis_port = None
        self.redis_dir = os.path.join(bench.tmp, "redis")
        os.makedirs(self.redis_dir)
        self.start_redis()
        self.redis = Redis(self.redis_port)
        _, self.origin_port = bench.nginx("origin", ORIGIN_HTTP)
        self.names = list(NAMES[:args.nodes])
        self.nodes = [Node(self, n) for n in self.names]
        self.await_reading()

    def start_redis(self):
        for _ in range(3):
            port = free_port()
            proc = self.b.spawn("redis", [
                REDIS, "--port", str(port), "--bind", "127.0.0.1",
                "--dir", self.redis_dir, "--appendonly", "yes",
                "--save", "", "--daemonize", "no"])
            if poll(lambda: not proc.alive() or redis_answers(port)) \
                    and proc.alive():
                self.redis_port = port
                self.redis_proc = proc
                return
            proc.stop()
        raise RuntimeError("redis-server did not start:\n" + proc.stderr())

    def await_reading(self):
        for node in self.nodes:
            state = os.path.join(node.dir, "fleet-esi_purges.state")
            if not poll(lambda: os.path.exists(state)):
                raise RuntimeError("%s never found its place on the stream"
                                   % node.name)

        def listed():
            names = sorted(n["node"] for n in
                           self.nodes[0].esictl("fleet", "--json")["nodes"])
            return names == self.names
        if not poll(listed):
            raise RuntimeError("not every node's heartbeat is in Redis")

    def cache_everywhere(self, keys):
        """GET every key at every node (a MISS that stores it), one thread
        per node; then every file must be on disk and esid must know the
        zone (the workers announced it)."""
        errors = []

        def fill_node(node):
            c = Client(node.port, timeout=30)
            try:
                for k in keys:
                    status, hdrs, _ = c.request("GET", k)
                    if status != 200:
                        errors.append("%s GET %s: %d" % (node.name, k, status))
                        return
            except OSError as e:
                errors.append("%s: %s" % (node.name, e))
            finally:
                c.close()
        threads = [threading.Thread(target=fill_node, args=(n,))
                   for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("caching: " + "; ".join(errors[:5]))
        for node in self.nodes:
            missing = [k for k in keys if not os.path.exists(node.path(k))]
            if missing:
                raise RuntimeError("%s: %d of %d pages not on disk (%s)" % (
                    node.name, len(missing), len(keys), missing[0]))
            if not poll(lambda: "pages" in node.esictl("zones", "--json")):
                raise RuntimeError("%s: esid does not know zone pages"
                                   % node.name)

    def drained(self):
        """Whether every node has processed every entry of the stream."""
        added = self.redis("XINFO", "STREAM", STREAM)
        added = dict(zip(added[::2], added[1::2])).get("entries-added", 0)
        return all(n.processed(n.esictl("stats", "--json")) >= added
                   for n in self.nodes)


# -- 1. fan-out latency --------------------------------------------------------------

def fanout(fleet, n, timeout=10.0):
    """n purges one at a time; per (source, target): ms from the PURGE's
    answer until the file is gone, bracketed by the last stat() that saw it."""
    keys = ["/fan/%d" % i for i in range(n)]
    fleet.cache_everywhere(keys)
    clients = {node.name: Client(node.port, timeout=30) for node in fleet.nodes}
    rows = []      # (i, source, target, gone_ms, seen_ms, local_ms, sent_ms)
    failures = []
    rounds = [0, 0.0]   # stat() rounds, seconds spent polling
    for i, key in enumerate(keys):
        src = fleet.nodes[i % len(fleet.nodes)]
        targets = [t for t in fleet.nodes if t is not src]
        paths = {t.name: t.path(key) for t in targets}
        t0 = time.perf_counter()
        status, hdrs, _ = clients[src.name].request("PURGE", key)
        t_answer = time.perf_counter()
        local_ms = (t_answer - t0) * 1000
        if status != 200 or hdrs.get("cache-purge-fleet") != "published" \
                or os.path.exists(src.path(key)):
            failures.append("%s PURGE %s: %d, fleet %s, file %s" % (
                src.name, key, status, hdrs.get("cache-purge-fleet"),
                "left" if os.path.exists(src.path(key)) else "gone"))
            continue
        seen = {name: t_answer for name in paths}
        gone = {}
        deadline = t_answer + timeout
        while len(gone) < len(paths):
            rounds[0] += 1
            for name, p in paths.items():
                if name in gone:
                    continue
                t = time.perf_counter()
                if os.path.exists(p):
                    seen[name] = t
                else:
                    gone[name] = t
            if time.perf_counter() > deadline:
                break
            time.sleep(0.0001)
        rounds[1] += time.perf_counter() - t_answer
        for t in targets:
            if t.name not in gone:
                failures.append("%s's purge of %s never reached %s" % (
                    src.name, key, t.name))
                continue
            rows.append((i, src.name, t.name,
                         (gone[t.name] - t_answer) * 1000,
                         (seen[t.name] - t_answer) * 1000, local_ms,
                         (gone[t.name] - t0) * 1000))
    for c in clients.values():
        c.close()
    return rows, failures, rounds[1] * 1000 / max(rounds[0], 1)


def stats_of(values):
    return {"n": len(values), "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": max(values) if values else float("nan")}


# -- 2. sustained rate ------------------------------------------------------------------

class Sender(threading.Thread):
    """Purges of `keys` on one keep-alive connection, the k-th at
    start + k / rate (sent at once when behind)."""

    def __init__(self, port, keys, rate, start):
        super().__init__(daemon=True)
        self.client = Client(port, timeout=30)
        self.keys = keys
        self.rate = rate
        self.start_at = start
        self.done = 0
        self.bad = []
        self.ms = []

    def run(self):
        try:
            for k, key in enumerate(self.keys):
                delay = self.start_at + k / self.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                t0 = time.perf_counter()
                status, hdrs, _ = self.client.request("PURGE", key)
                self.ms.append((time.perf_counter() - t0) * 1000)
                if status != 200 or hdrs.get("cache-purge-fleet") \
                        != "published":
                    if len(self.bad) < 5:
                        self.bad.append("PURGE %s: %d %s" % (
                            key, status, hdrs.get("cache-purge-fleet")))
                self.done += 1
        except OSError as e:
            self.bad.append(str(e))
        finally:
            self.end_at = time.perf_counter()
            self.client.close()


def redis_sample(fleet):
    info = fleet.redis.info()
    return {"used_memory": int(info["used_memory"]),
            "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
            "net_in": int(info["total_net_input_bytes"]),
            "net_out": int(info["total_net_output_bytes"]),
            "commands": int(info["total_commands_processed"]),
            "xlen": fleet.redis("XLEN", STREAM),
            "clients": int(info["connected_clients"])}


def rate_test(fleet, rate, seconds, per_node=2):
    total = int(rate * seconds)
    keys = ["/rate/%d" % i for i in range(total)]
    fleet.cache_everywhere(keys)
    if not poll(fleet.drained):
        raise RuntimeError("the fleet did not drain before the rate test")
    senders_n = per_node * len(fleet.nodes)
    r0 = redis_sample(fleet)
    t_start = time.perf_counter() + 0.2
    senders = [Sender(fleet.nodes[s % len(fleet.nodes)].port,
                      keys[s::senders_n], rate / senders_n, t_start)
               for s in range(senders_n)]
    for s in senders:
        s.start()
    samples = []   # (t, node, lag_entries, lag_ms, backlog, processed)
    redis_series = []
    next_sample = t_start + 1.0
    while any(s.is_alive() for s in senders):
        delay = next_sample - time.perf_counter()
        if delay > 0:
            time.sleep(min(delay, 0.05))
            continue
        next_sample += 1.0
        t = time.perf_counter() - t_start
        for node in fleet.nodes:
            f = node.esictl("fleet", "--json")
            st = f["stats"]
            proc = node.processed(st)
            samples.append((t, node.name, st["fleet_lag_entries"],
                            st["fleet_lag_ms"],
                            max(f.get("stream_entries_added", 0) - proc, 0),
                            proc))
        rs = redis_sample(fleet)
        rs["t"] = t
        redis_series.append(rs)
    for s in senders:
        s.join()
    t_sent = max(s.end_at for s in senders)
    sent = sum(s.done for s in senders)
    t0 = time.perf_counter()
    drained = poll(fleet.drained, bound=60, interval=0.005)
    drain_s = time.perf_counter() - t0 + (t0 - t_sent)
    r1 = redis_sample(fleet)
    left = {}
    for node in fleet.nodes:
        n = sum(os.path.exists(node.path(k)) for k in keys)
        if n:
            left[node.name] = n
    bad = [b for s in senders for b in s.bad]
    per_purge = {"cpu_us": (r1["cpu"] - r0["cpu"]) * 1e6 / max(sent, 1),
                 "net_in": (r1["net_in"] - r0["net_in"]) / max(sent, 1),
                 "net_out": (r1["net_out"] - r0["net_out"]) / max(sent, 1),
                 "commands": (r1["commands"] - r0["commands"]) / max(sent, 1),
                 "memory": (r1["used_memory"] - r0["used_memory"]) /
                 max(sent, 1)}
    ms = [m for s in senders for m in s.ms]
    return {"target": rate, "seconds": seconds, "sent": sent,
            "elapsed": t_sent - t_start, "achieved": sent / (t_sent - t_start),
            "samples": samples, "redis": redis_series, "r0": r0, "r1": r1,
            "drained": bool(drained), "drain_s": drain_s, "left": left,
            "bad": bad, "per_purge": per_purge, "purge_ms": stats_of(ms),
            "senders": senders_n}


def lag_verdict(r):
    """Backlog (entries not yet processed) per node at the first and the
    last sample, and whether it grew: the end above both the start and
    one read's batch (256 entries) counts as growth."""
    out = {}
    for name in sorted(set(s[1] for s in r["samples"])):
        series = [s for s in r["samples"] if s[1] == name]
        if not series:
            continue
        first, last = series[0], series[-1]
        worst = max(series, key=lambda s: s[4])
        out[name] = {"start": first[4], "end": last[4], "max": worst[4],
                     "esid_start": first[2], "esid_end": last[2],
                     "lag_ms_end": last[3],
                     "grew": last[4] > max(first[4], BATCH)}
    return out


# -- reporting ---------------------------------------------------------------------------

def markdown(args, info, fan, fan_fail, rate, meta):
    L = []
    L.append("## Fleet run, %s" % meta["started"].strftime("%Y-%m-%d %H:%M"))
    L.append("")
    machine = "%s cores, %s, %s, Linux %s; nginx %s, redis %s" % (
        info["nproc"], info["cpu"].split()[0] + " " + info["cpu"].split()[1]
        if len(info["cpu"].split()) > 1 else info["cpu"], info["memory"],
        info["kernel"], info["nginx"], meta["redis_version"])
    L.append("Machine: %s. Measured: %s. Load average %s before, %s after; "
             "run took %.0f s. Redis (appendonly yes, everysec), %d nodes "
             "(nginx `worker_processes 1` + esid each), all on 127.0.0.1; "
             "nginx, esid, Redis and the client at niceness %d." % (
                 machine, info["product"], meta["load_before"],
                 meta["load_after"], meta["elapsed"], args.nodes, args.nice))
    L.append("")
    L.append("### Fan-out latency: from the PURGE's answer at one node "
             "until the file is gone at another, ms")
    L.append("")
    L.append("%s purges, one at a time, sent to each node in turn; each "
             "pair (source, target) timed by polling the target's cache "
             "file with stat(), one round of the other nodes every %s ms "
             "(a 0.1 ms sleep between rounds). A figure is the first stat() "
             "that found the file gone; the gap to the last stat() that "
             "still saw it, the precision, was %s ms at the median and %s "
             "ms at p99. In %d of %d cases the file was gone at the first "
             "stat() after the answer (the other node had applied the "
             "purge before the source's HTTP answer reached the client): "
             "esid publishes as it answers the worker, and the stream's "
             "round trip is as short as the worker's own answer. The "
             "column \"from the request\" counts from the PURGE's first "
             "byte sent instead." % (
                 "{:,}".format(args.purges), fmt_ms(meta["poll_ms"]),
                 fmt_ms(meta["poll_gap_p50"]), fmt_ms(meta["poll_gap_p99"]),
                 meta["first_check"], len(fan)))
    L.append("")
    L.append("| source → target | samples | p50 | p99 | max | from the "
             "request: p50 | p99 | max |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    pairs = sorted(set((r[1], r[2]) for r in fan))
    for src, dst in pairs + [(None, None)]:
        sel = [r for r in fan if src is None or (r[1], r[2]) == (src, dst)]
        s = stats_of([r[3] for r in sel])
        q = stats_of([r[6] for r in sel])
        L.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            "%s → %s" % (src, dst) if src else "**all**", s["n"],
            fmt_ms(s["p50"]), fmt_ms(s["p99"]), fmt_ms(s["max"]),
            fmt_ms(q["p50"]), fmt_ms(q["p99"]), fmt_ms(q["max"])))
    loc = stats_of(list({r[0]: r[5] for r in fan}.values()))
    L.append("")
    L.append("The PURGE itself at the source (request to answer, the file "
             "gone there): p50 %s ms, p99 %s ms. Failures: %d%s." % (
                 fmt_ms(loc["p50"]), fmt_ms(loc["p99"]), len(fan_fail),
                 (" (" + "; ".join(fan_fail[:3]) + ")") if fan_fail else ""))
    L.append("")
    L.append("### Sustained rate")
    L.append("")
    v = lag_verdict(rate)
    pp = rate["per_purge"]
    L.append("Target %s purges/s for %d s over %d keep-alive connections "
             "(2 per node, each purging pages cached at every node); "
             "achieved **%s purges/s** (%s purges in %.2f s; PURGE answer "
             "p50 %s ms, p99 %s ms). Every node processed every entry %.2f s "
             "after the last PURGE was answered; pages left on disk "
             "afterwards: %s. Errors: %d%s." % (
                 fmt(rate["target"]), rate["seconds"], rate["senders"],
                 fmt(rate["achieved"]), "{:,}".format(rate["sent"]),
                 rate["elapsed"],
                 fmt_ms(rate["purge_ms"]["p50"]),
                 fmt_ms(rate["purge_ms"]["p99"]), rate["drain_s"],
                 ", ".join("%s %d" % kv for kv in rate["left"].items())
                 or "none", len(rate["bad"]),
                 (" (" + "; ".join(rate["bad"][:3]) + ")") if rate["bad"]
                 else ""))
    L.append("")
    L.append("Backlog: entries added to the stream that the node had not "
             "processed yet (XINFO entries-added against its applied + own "
             "+ skipped counters), sampled once a second with `esictl fleet "
             "--json`, beside esid's own `fleet_lag_entries` (counted at "
             "its last read):")
    L.append("")
    L.append("| node | backlog at 1 s | at the end | max | esid lag at 1 s | "
             "at the end | lag ms at the end | grew |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, x in v.items():
        L.append("| %s | %d | %d | %d | %d | %d | %d | %s |" % (
            name, x["start"], x["end"], x["max"], x["esid_start"],
            x["esid_end"], x["lag_ms_end"], "**yes**" if x["grew"] else "no"))
    L.append("")
    names = sorted(v)
    L.append("Per second (each node's backlog; Redis used_memory, XLEN):")
    L.append("")
    L.append("| t s | %s | used_memory | XLEN |" % " | ".join(names))
    L.append("|---:|%s---:|---:|" % ("---:|" * len(names)))
    for rs in rate["redis"]:
        row = {s[1]: s[4] for s in rate["samples"] if abs(s[0] - rs["t"]) <
               0.5}
        L.append("| %.0f | %s | %s | %s |" % (
            rs["t"], " | ".join(str(row.get(n, "?")) for n in names),
            "{:,}".format(rs["used_memory"]), "{:,}".format(rs["xlen"])))
    L.append("")
    L.append("What the rate test cost Redis, per purge (INFO before and "
             "after, the drain included): %.0f µs of CPU (used_cpu_sys + "
             "used_cpu_user), %.1f commands, %s bytes in and %s bytes out "
             "over the network (%d nodes reading), %.0f bytes more "
             "used_memory; at the end used_memory %s bytes, XLEN %s, %d "
             "clients." % (
                 pp["cpu_us"], pp["commands"], fmt(pp["net_in"]),
                 fmt(pp["net_out"]), args.nodes, pp["memory"],
                 "{:,}".format(rate["r1"]["used_memory"]),
                 "{:,}".format(rate["r1"]["xlen"]), rate["r1"]["clients"]))
    L.append("")
    fan_all = stats_of([r[3] for r in fan])
    goals = [
        "fan-out p50 %s ms (goal < 50 ms: %s)" % (
            fmt_ms(fan_all["p50"]),
            "met" if fan_all["p50"] < 50 else "**not met**"),
        "%s purges/s sustained of %s (goal 1,000/s with no growth in "
        "lag: %s)" % (
            fmt(rate["achieved"]), fmt(rate["target"]),
            "met" if rate["achieved"] >= 0.95 * 1000 and not any(
                x["grew"] for x in v.values()) else "**not met**"),
        "lag %s" % ("did not grow" if not any(x["grew"] for x in v.values())
                    else "**grew**")]
    L.append("Goals: " + "; ".join(goals) + ".")
    L.append("")
    return "\n".join(L)


def write_csv(path, fan, rate):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "i_or_t", "source_or_node", "target", "gone_ms",
                    "last_seen_ms", "local_ms", "gone_from_request_ms",
                    "lag_entries", "lag_ms", "backlog", "processed"])
        for r in fan:
            w.writerow(["fanout", r[0], r[1], r[2], "%.3f" % r[3],
                        "%.3f" % r[4], "%.3f" % r[5], "%.3f" % r[6],
                        "", "", "", ""])
        for s in rate["samples"]:
            w.writerow(["rate", "%.2f" % s[0], s[1], "", "", "", "", "",
                        s[2], s[3], s[4], s[5]])
        for rs in rate["redis"]:
            w.writerow(["redis", "%.2f" % rs["t"], "", "", "", "", "", "",
                        "", "", rs["used_memory"], rs["xlen"]])


# -- main --------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--product", default="?")
    p.add_argument("--purges", type=int, default=1000,
                   help="purges of the fan-out measurement")
    p.add_argument("--rate", type=float, default=1000,
                   help="purges a second of the rate test")
    p.add_argument("--duration", type=float, default=10,
                   help="seconds of the rate test")
    p.add_argument("--nodes", type=int, default=3,
                   help="NGINX + esid nodes (2 to 26)")
    p.add_argument("--smoke", action="store_true",
                   help="10 purges, a 1 s rate test, every purge checked "
                   "at every node; no results written")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--nice", type=int, default=-10,
                   help="niceness of everything started here (0: leave it)")
    p.add_argument("--tmp", help="where the temporary directory goes "
                   "(default: the system's; the smoke's: /dev/shm, since "
                   "removing the nodes' cache directories takes seconds on "
                   "a disk mounted with discard)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if not 2 <= args.nodes <= len(NAMES):
        p.error("--nodes: 2 to %d" % len(NAMES))
    for f in ("esid", "esictl", "ngx_http_esi_module.so"):
        if not os.path.exists(os.path.join(args.build_dir, f)):
            p.error("%s/%s missing" % (args.build_dir, f))
    if not os.path.exists(REDIS):
        p.error("redis-server missing (packaging/deps.sh installs it)")
    if args.smoke:
        args.purges, args.duration, args.no_readme = 10, 1, True
        args.nice = 0
        if args.tmp is None and os.path.isdir("/dev/shm"):
            args.tmp = "/dev/shm"
    if args.tmp:
        tempfile.tempdir = args.tmp
    args.workers = "1"   # running.Servers's nginx: one worker per node
    # The senders are threads: hand the GIL on sooner than every 5 ms, so
    # that one waiting for an answer does not hold up the others.
    sys.setswitchinterval(0.0005)

    exit_on_signals()
    if args.nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as e:
            log("cannot set niceness %d: %s" % (args.nice, e))
            args.nice = 0

    started = datetime.datetime.now()
    t_start = time.monotonic()
    load_before = loadavg()
    bench = Servers(args)
    ok = False
    problems = []
    try:
        fleet = Fleet(args, bench)
        log("redis on %d, origin on %d, nodes %s" % (
            fleet.redis_port, fleet.origin_port,
            ", ".join("%s on %d" % (n.name, n.port) for n in fleet.nodes)))
        fan, fan_fail, poll_ms = fanout(fleet, args.purges)
        problems += fan_fail
        gone = [r[3] for r in fan]
        s = stats_of(gone)
        gaps = [r[3] - r[4] for r in fan]
        log("fan-out: %d of %d deliveries; p50 %s ms, p99 %s ms, max %s ms "
            "(poll bracket p50 %s ms, p99 %s ms)" % (
                len(fan), (args.nodes - 1) * args.purges, fmt_ms(s["p50"]),
                fmt_ms(s["p99"]), fmt_ms(s["max"]), fmt_ms(percentile(gaps, 50)),
                fmt_ms(percentile(gaps, 99))))
        rate = rate_test(fleet, args.rate, args.duration)
        for x in rate["samples"]:
            log("  t=%.1f s %s: backlog %d, esid lag %d entries / %d ms" % (
                x[0], x[1], x[4], x[2], x[3]))
        log("rate: %d purges in %.2f s = %s/s (target %s); drained %s "
            "after %.2f s; left on disk: %s; Redis used_memory %s, XLEN %d"
            % (rate["sent"], rate["elapsed"], fmt(rate["achieved"]),
               fmt(rate["target"]), rate["drained"], rate["drain_s"],
               rate["left"] or "none", "{:,}".format(
                   rate["r1"]["used_memory"]), rate["r1"]["xlen"]))
        pp = rate["per_purge"]
        log("Redis per purge: %.0f us CPU, %.1f commands, %.0f B in, %.0f B "
            "out, %.0f B memory" % (pp["cpu_us"], pp["commands"],
                                    pp["net_in"], pp["net_out"],
                                    pp["memory"]))
        if not rate["drained"]:
            problems.append("the fleet did not process every entry within "
                            "60 s of the rate test")
        if rate["left"]:
            problems.append("pages left after the rate test: %s" %
                            rate["left"])
        problems += rate["bad"]
        for node in fleet.nodes:
            st = node.esictl("stats", "--json")
            for k in ("fleet_gaps", "fleet_failed", "fleet_skipped",
                      "fleet_dropped"):
                if st.get(k):
                    problems.append("%s: %s %d" % (node.name, k, st[k]))
            if not node.esid.alive() or not node.nginx.alive():
                problems.append("%s: a process died" % node.name)
        version = fleet.redis.info().get("redis_version", "?")
        ok = not problems
        if args.smoke:
            log("smoke: %d problem(s) (%.0f s)" % (
                len(problems), time.monotonic() - t_start))
            for x in problems:
                log("  " + x)
            return 0 if ok else 1
        meta = {"started": started, "load_before": load_before,
                "load_after": loadavg(), "redis_version": version,
                "elapsed": time.monotonic() - t_start,
                "poll_ms": poll_ms,
                "first_check": sum(r[4] == 0 for r in fan),
                "poll_gap_p50": percentile(gaps, 50),
                "poll_gap_p99": percentile(gaps, 99)}
        info = machine_info(args)
        md = markdown(args, info, fan, fan_fail, rate, meta)
        os.makedirs(args.results, exist_ok=True)
        base = os.path.join(args.results, "%s-fleet%s" % (
            started.strftime("%Y-%m-%d"),
            "" if args.nodes == 3 else "-%dnodes" % args.nodes))
        with open(base + ".md", "w") as f:
            f.write(md)
        write_csv(base + ".csv", fan, rate)
        print()
        print(md)
        log("results: %s.md, %s.csv" % (base, base))
        if problems:
            for x in problems:
                log("problem: " + x)
        if not args.no_readme and args.nodes == 3:
            update_readme(md, [], marker="fleet")
        return 0 if ok else 1
    finally:
        bench.finish(ok, args.keep)


if __name__ == "__main__":
    sys.exit(main())
