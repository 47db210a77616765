#!/usr/bin/env python3
"""The purge benchmark behind `bench/run.sh --purge` (issue #5).

Zones of 10k and 100k (--sizes 10k,100k+1m: then 1M on its own) small
cache files are written directly in NGINX's on-disk format (levels=1:2,
version-5 header, KEY line, a raw response; one key in ten Vary'd on
Accept-Encoding with two files, the first under MD5(key), the second under
its variant hash, as NGINX stores them), checked against files NGINX
itself writes.  One Debian nginx (worker_processes 1) serves a group of
zones; its cache loader loads them before anything is timed.  Then, with
reloads of that nginx (the keys_zones survive a reload), three arms:

  scan    our module + esid with `esi_purge_index off`: every purge makes
          esid read the zone's directory (on its thread pool); a steady
          client sends cache HITs on other keys to the same single worker
          throughout, so its latency during the scans can be compared with
          its latency between them and while a process spins on a core
  index   our module + another esid with the index on, after esid's first
          scan completed it (`esictl zones --json`)
  pattern our module + a third esid with the index on: Magento's PURGE /
          with an X-Magento-Tags-Pattern that is not its tag-list shape
          (`^store,TAG$`, one key's own tag), which esid evaluates with RE2
          over every object of the zone on its thread pool; the probe runs
          as in the scan arm, with the same control (warm only)
  cache_purge
          Debian's ngx_cache_purge 2.3 (`proxy_cache_purge ZONE KEY` in a
          location of its own): latency and what it really removes (files
          left on disk, the same purge again, a HIT on the variant it left)

each warm, then cold: `sync; echo 3 > /proc/sys/vm/drop_caches` before each
purge (root only; without it cold is skipped and said so).

The zones live on an ext4 of their own (a loop device over a sparse file
in the temporary directory, direct I/O), made here and removed at the end:
the machine's root file system has no journal and is mounted with
`discard`; there ext4 checks every free inode for a recent deletion before
reusing it, creating a million files takes many minutes, deleting 100k
took six, and every other file creation on the machine slows for minutes
after.

Every generated object carries `X-Magento-Tags: store,TAG` (TAG its key
with "/" made "_"), as a Magento page carries its tags.

--smoke: 1k files in a plain directory, no loader wait, one purge each way
with its count checked, no timing (part of `bench/run.sh --smoke`).

Everything started here is stopped on the way out, also on failure.
"""

import argparse
import contextlib
import csv
import datetime
import gc
import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reporting  # noqa: E402
import support_path  # noqa: E402,F401  (tests/support on sys.path)
from esitest import fill, poll, worker_pids  # noqa: E402
from reporting import fmt_ms, update_readme  # noqa: E402
from running import (Servers, exit_on_signals, loadavg,  # noqa: E402
                     machine_info)

CACHE_PURGE_MODULE = "/usr/lib/nginx/modules/ngx_http_cache_purge_module.so"
DROP_CACHES = "/proc/sys/vm/drop_caches"

# ngx_http_file_cache_header_t, NGX_HTTP_CACHE_VERSION 5, x86-64:
# version u64; valid_sec, updating_sec, error_sec, last_modified, date
# time_t; crc32 u32; valid_msec, header_start, body_start u16; etag_len u8,
# etag[128]; vary_len u8, vary[128]; variant[16]; padding to 336.
HEADER = struct.Struct("<Q5qI3HB128sB128s16s4x")
assert HEADER.size == 336
KEY_PREFIX = b"\nKEY: "
VARY = b"Accept-Encoding"
# The two clients of every Vary'd key: the first stored (MD5(key)), then
# the second (its variant hash).  Purge requests send no Accept-Encoding.
VARIANTS = (b"gzip", b"")
VARY_EVERY = 10     # one key in ten is Vary'd (2 files): 18% of the files
PROBE_KEYS = 32

SIZES = {"1k": 1000, "10k": 10000, "100k": 100000, "1m": 1000000}


def log(msg):
    reporting.log("purge: " + msg)


# -- cache files in NGINX's format ---------------------------------------------------

def md5(data):
    return hashlib.md5(data).digest()


def variant_hash(main, value):
    """ngx_http_file_cache_vary() for `Vary: Accept-Encoding` and a request
    whose Accept-Encoding is `value` (already normalised; b"" if absent)."""
    return md5(main + VARY.lower() + b":" + value + b"\r\n")


def tag_of(key):
    """The key's own tag: b"/z10k/v/7" -> b"z10k_v_7"."""
    return key.strip(b"/").replace(b"/", b"_")


def cache_file(key, body, now, vary=b"", variant=b"\0" * 16):
    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
           b"Content-Length: %d\r\n" % len(body))
    raw += b"X-Magento-Tags: store," + tag_of(key) + b"\r\n"
    if vary:
        raw += b"Vary: " + vary + b"\r\n"
    raw += b"Connection: close\r\n\r\n"
    header_start = HEADER.size + len(KEY_PREFIX) + len(key) + 1
    head = HEADER.pack(5, now + 10 * 365 * 86400, 0, 0, -1, now,
                       zlib.crc32(key), 0, header_start,
                       header_start + len(raw), 0, b"", len(vary), vary,
                       variant)
    return head + KEY_PREFIX + key + b"\n" + raw + body


def relpath(name_hex):
    """levels=1:2: the last hex digit, then the two before it."""
    return "%s/%s/%s" % (name_hex[-1], name_hex[-3:-1], name_hex)


def plain_key(zone, i):
    return ("/%s/s/%d" % (zone, i)).encode()


def vary_key(zone, j):
    return ("/%s/v/%d" % (zone, j)).encode()


def body_of(key, variant=None):
    label = b"" if variant is None else b" " + (variant or b"identity")
    return b"<p>" + key + label + b"</p>\n"


def files_of(key, vary):
    """The relative paths of a key's files (key_files() without the
    bytes): MD5(key), and for a Vary'd key the second client's variant."""
    main = md5(key)
    if not vary:
        return [relpath(main.hex())]
    return [relpath(main.hex()),
            relpath(variant_hash(main, VARIANTS[1]).hex())]


def key_files(key, vary, now):
    """[(relative path, file bytes)] for one key, as NGINX stores it."""
    main = md5(key)
    if not vary:
        return [(relpath(main.hex()), cache_file(key, body_of(key), now))]
    out = []
    for n, value in enumerate(VARIANTS):
        h = variant_hash(main, value)
        name = main if n == 0 else h
        out.append((relpath(name.hex()), cache_file(
            key, body_of(key, value), now, VARY, h)))
    return out


def _write_keys(job):
    """Worker of generate(): writes keys [start, stop) of one zone."""
    root, zone, plain, start, stop, now = job
    made = set()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    for k in range(start, stop):
        if k < plain:
            files = key_files(plain_key(zone, k), False, now)
        else:
            files = key_files(vary_key(zone, k - plain), True, now)
        for rel, data in files:
            d = root + "/" + rel[:4]
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            fd = os.open(root + "/" + rel, flags, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    return stop - start


class Zone:
    """One generated proxy_cache zone: N files, 1 key in 10 Vary'd."""

    def __init__(self, label, files, root):
        self.label = label
        self.name = "z" + label
        self.files = files
        self.path = os.path.join(root, self.name)
        # keys = plain + vary, vary = keys / VARY_EVERY, files = plain + 2 vary
        self.vary = max(files // (VARY_EVERY + 1), 1)
        self.plain = files - 2 * self.vary
        self.keys = self.plain + self.vary
        order = list(range(self.vary))
        random.Random(files).shuffle(order)
        self.unused = order           # Vary'd keys not purged yet
        self.probe = [plain_key(self.name, i) for i in random.Random(
            files + 1).sample(range(self.plain), min(PROBE_KEYS, self.plain))]
        # Generous: NGINX's node is ~120 bytes in its slab.
        self.keys_zone_mb = max(4, math.ceil(files * 256 / 2 ** 20))
        self.stats = {}

    def take(self):
        """A Vary'd key still on disk, never purged in this run."""
        if not self.unused:
            raise RuntimeError("%s: out of Vary'd keys" % self.name)
        return vary_key(self.name, self.unused.pop())

    def generate(self, jobs):
        now = int(time.time())
        t0 = time.monotonic()
        chunk = max(1000, self.keys // (jobs * 8))
        work = [(self.path, self.name, self.plain, s,
                 min(s + chunk, self.keys), now)
                for s in range(0, self.keys, chunk)]
        os.makedirs(self.path, exist_ok=True)
        if jobs > 1 and len(work) > 1:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                written = sum(pool.map(_write_keys, work, chunksize=1))
        else:
            written = sum(map(_write_keys, work))
        assert written == self.keys
        self.stats["gen_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        os.sync()
        self.stats["sync_s"] = time.monotonic() - t1

    def resident(self, sample=400):
        """The fraction of a random sample of the zone's files whose page
        is in the page cache (util-linux fincore), or None."""
        rng = random.Random()
        rels = []
        for _ in range(sample):
            k = rng.randrange(self.keys)
            key = plain_key(self.name, k) if k < self.plain else \
                vary_key(self.name, k - self.plain)
            rels.append(files_of(key, k >= self.plain)[0])
        paths = [os.path.join(self.path, r) for r in rels
                 if os.path.exists(os.path.join(self.path, r))]
        try:
            out = subprocess.run(["fincore", "-n", "-o", "PAGES"] + paths,
                                 capture_output=True, text=True).stdout
        except OSError:
            return None
        pages = [int(x) for x in out.split()]
        return sum(1 for x in pages if x > 0) / len(pages) if pages else None

    def on_disk(self, key):
        """How many of the key's files exist."""
        vary = b"/v/" in key
        return sum(os.path.exists(os.path.join(self.path, rel))
                   for rel in files_of(key, vary))


def compare_with_nginx(made_dir, key, vary):
    """None if NGINX's own files for `key` (under made_dir) have the names
    and the header fields the generator writes, else what differs."""
    ours = dict(key_files(key, vary, 0))
    theirs = {}
    for top, _, names in os.walk(made_dir):
        for n in names:
            rel = os.path.relpath(os.path.join(top, n), made_dir)
            with open(os.path.join(top, n), "rb") as f:
                data = f.read()
            if KEY_PREFIX + key + b"\n" in data[:HEADER.size + 600]:
                theirs[rel] = data
    if sorted(ours) != sorted(theirs):
        return "files %s, NGINX made %s" % (sorted(ours), sorted(theirs))
    for rel, data in ours.items():
        a, b = HEADER.unpack_from(data), HEADER.unpack_from(theirs[rel])
        # version, crc32, header_start, vary_len, vary, variant
        for idx, what in ((0, "version"), (6, "crc32"),
                          (8, "header_start"), (12, "vary_len"),
                          (13, "vary"), (14, "variant")):
            if a[idx] != b[idx]:
                return "%s: %s %r, NGINX wrote %r" % (rel, what, a[idx],
                                                      b[idx])
        end = a[8]
        if data[HEADER.size:end] != theirs[rel][HEADER.size:end]:
            return "%s: KEY line differs" % rel
    return None


# -- a small HTTP/1.1 client (keep-alive, one request at a time) ----------------------

class Client:
    def __init__(self, port, timeout=3600.0):
        self.port = port
        self.timeout = timeout
        self.sock = None
        self.buf = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by nginx")
        self.buf += data

    def request(self, method, path, headers=None):
        """(status, {lowercase name: value}, body)."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port),
                                                 timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: bench"]
        lines += ["%s: %s" % kv for kv in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        first, *rest = head.decode("latin-1").split("\r\n")
        status = int(first.split()[1])
        hdrs = {}
        for line in rest:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            while len(self.buf) < n:
                self._fill()
            body, self.buf = self.buf[:n], self.buf[n:]
        elif hdrs.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    self._fill()
                size, _, self.buf = self.buf.partition(b"\r\n")
                n = int(size.split(b";")[0], 16)
                while len(self.buf) < n + 2:
                    self._fill()
                body += self.buf[:n]
                self.buf = self.buf[n + 2:]
                if n == 0:
                    break
        else:
            body = b""
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, hdrs, body

    def timed(self, method, path, headers=None):
        """(milliseconds, status, headers, body)."""
        t0 = time.perf_counter()
        status, hdrs, body = self.request(method, path, headers)
        return (time.perf_counter() - t0) * 1000, status, hdrs, body


class Probe(threading.Thread):
    """Cache HITs on other keys, one at a time on one keep-alive connection,
    one every `interval` s: each sample is (start, ms, ok)."""

    def __init__(self, port, keys, interval):
        super().__init__(daemon=True)
        self.client = Client(port, timeout=30)
        self.keys = keys
        self.interval = interval
        self.samples = []
        self.failures = []
        self.halt = threading.Event()

    def run(self):
        i = 0
        nxt = time.perf_counter()
        while not self.halt.is_set():
            key = self.keys[i % len(self.keys)]
            i += 1
            t0 = time.perf_counter()
            try:
                status, hdrs, body = self.client.request("GET", key.decode())
                ok = (status == 200 and hdrs.get("x-cache-status") == "HIT"
                      and body == body_of(key))
                if not ok and len(self.failures) < 5:
                    self.failures.append("%s: %s %s %r" % (
                        key.decode(), status, hdrs.get("x-cache-status"),
                        body[:80]))
            except OSError as e:
                ok = False
                self.client.close()
                if len(self.failures) < 5:
                    self.failures.append("%s: %s" % (key.decode(), e))
            t1 = time.perf_counter()
            self.samples.append((t0, (t1 - t0) * 1000, ok))
            nxt = max(nxt + self.interval, t1)
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    def stop(self):
        self.halt.set()
        self.join()
        self.client.close()


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def summary(ms):
    return {"n": len(ms), "ms": list(ms), "p50": percentile(ms, 50),
            "p99": percentile(ms, 99),
            "max": max(ms) if ms else float("nan"),
            "mean": sum(ms) / len(ms) if ms else float("nan")}


# -- nginx configurations ---------------------------------------------------------------

HTTP = """\
    access_log off;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
@@CACHE_PATHS@@
@@ARM_HTTP@@

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        proxy_cache_key $uri$is_args$args;
        proxy_cache_valid 200 30d;
        add_header X-Cache-Status $upstream_cache_status;

@@LOCATIONS@@

        # The origin of a MISS (the format check, and any key purged).
        location /origin/ {
            return 200 "<p>origin $uri</p>\\n";
        }
        location /origin/v {
            add_header Vary Accept-Encoding;
            return 200 "<p>origin $uri</p>\\n";
        }
    }
"""

ZONE_LOCATION = """\
        location /@@ZONE@@/ {
            proxy_pass http://127.0.0.1:@@PORT@@/origin/;
            proxy_cache @@ZONE@@;
@@PURGE@@
        }
"""

CACHE_PURGE_LOCATION = """\
        location ~ ^/cp(/@@ZONE@@/.*)$ {
            allow 127.0.0.1;
            deny all;
            proxy_cache_purge @@ZONE@@ $1$is_args$args;
        }
"""


class Run:
    """One nginx for every zone, reloaded from arm to arm, and one esid per
    arm of ours."""

    def __init__(self, args, bench, zones, root):
        self.args = args
        self.b = bench
        self.zones = zones
        self.root = root          # where the zones live
        self.check = os.path.join(root, "check")
        self.esids = {}           # arm -> (process, socket)
        self.arm = None
        self.nginx = None
        self.port = None
        self.module = os.path.join(args.build_dir, "ngx_http_esi_module.so")
        self.esictl = os.path.join(args.build_dir, "esictl")
        self.errlog = os.path.join(self.b.tmp, "nginx", "error.log")

    # -- configuration ---------------------------------------------------

    def http(self, arm):
        paths = []
        for z in self.zones:
            paths.append(
                "    proxy_cache_path %s levels=1:2 keys_zone=%s:%dm "
                "inactive=30d use_temp_path=off loader_files=100000 "
                "loader_sleep=1ms loader_threshold=60000ms;" % (
                    z.path, z.name, z.keys_zone_mb))
        paths.append("    proxy_cache_path %s levels=1:2 keys_zone=check:1m "
                     "inactive=30d use_temp_path=off;" % self.check)
        arm_http = ""
        purge = ""
        locations = []
        if arm in OURS:
            arm_http = ("    esi_daemon unix:%s;\n    esi_purge_index %s;\n"
                        "    esi_purge_timeout 3600s;\n" % (
                            self.esids[arm][1],
                            "off" if arm == "scan" else
                            self.index_size()))
            purge = "            esi_cache_purge PURGE from 127.0.0.1;"
        for name in [z.name for z in self.zones] + ["check"]:
            locations.append(fill(ZONE_LOCATION, {
                "ZONE": name, "PURGE": purge}, strict=False))
            if arm == "cache_purge":
                locations.append(fill(CACHE_PURGE_LOCATION,
                                        {"ZONE": name}))
        return fill(HTTP, {"CACHE_PATHS": "\n".join(paths),
                             "ARM_HTTP": arm_http,
                             "LOCATIONS": "\n".join(locations)},
                      strict=False)

    def modules(self, arm):
        if arm == "cache_purge":
            return "load_module %s;" % CACHE_PURGE_MODULE
        return "load_module %s;" % self.module

    def index_size(self):
        if self.args.index_size:
            return self.args.index_size
        # esid counts ~140 bytes a file (13.8 MB at 100k); room to spare.
        return "%dm" % max(64, math.ceil(max(z.files for z in self.zones)
                                         * 400 / 2 ** 20))

    # -- processes -------------------------------------------------------

    def start_esid(self, arm):
        sock = os.path.join(self.b.tmp, "esid-%s.sock" % arm)
        proc = self.b.esid("esid-" + arm, sock, "--log-level", "info")
        self.esids[arm] = (proc, sock)

    def enter(self, arm, meta):
        """nginx in `arm`'s configuration: started (then its cache loader
        waited for) or reloaded.  Each arm of ours has an esid of its own,
        started on first entry and kept: esid reads a zone's directory
        when a worker first announces it, not when one announces it again
        (the scan arm comes back for its cold phase)."""
        if arm == self.arm:
            return
        fresh = arm in OURS and arm not in self.esids
        if fresh:
            self.start_esid(arm)
        t0 = time.monotonic()
        if self.nginx is None:
            self.start_nginx(arm)
            if not self.args.smoke:
                log("waiting for NGINX's cache loader (it starts 60 s after "
                    "nginx)")
                meta["loader_s"] = self.wait_loader(
                    600 + sum(z.files for z in self.zones) / 1000)
                log("cache loader done %.0f s after nginx started" %
                    meta["loader_s"])
        else:
            self.reload(arm)
        self.arm = arm
        if fresh:
            done, zs = self.wait_esid_scans(arm != "scan")
            if arm == "index":
                for z in self.zones:
                    z.stats["index_build_s"] = done[z.name]
                    z.stats["index_bytes"] = zs[z.name]["index_bytes"]
                log("esid's index complete for every zone %.1f s after the "
                    "worker started" % (time.monotonic() - t0))

    def start_nginx(self, arm):
        t0 = time.monotonic()
        self.nginx, self.port = self.b.nginx("nginx", self.http(arm),
                                             self.modules(arm), "info")
        self.nginx_started = t0
        log("nginx on 127.0.0.1:%d (%s arm), pid %d" % (
            self.port, arm, self.nginx.pid))

    def workers(self):
        return worker_pids(self.nginx.pid)

    def reload(self, arm):
        """nginx -s reload into `arm`'s configuration; returns once the old
        worker is gone and a new one runs."""
        old = set(self.workers())
        self.b.nginx_conf("nginx", self.http(arm), self.modules(arm),
                          self.port, "info")
        at = os.path.getsize(self.errlog)
        os.kill(self.nginx.pid, signal.SIGHUP)

        def switched():
            now = set(self.workers())
            return now and not (now & old)
        if not poll(switched, 60):
            raise RuntimeError("reload into %s failed:\n%s" % (
                arm, self.log_since(at)[-3000:]))
        log("nginx reloaded into the %s arm" % arm)

    def log_since(self, offset):
        with open(self.errlog, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    def wait_loader(self, bound):
        """Until NGINX's cache loader has loaded every zone (it starts 60 s
        after nginx does)."""
        want = len(self.zones) + 1

        def loaded():
            with open(self.errlog, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            return text.count("http file cache: ") >= want
        if not poll(loaded, bound, 0.2):
            raise RuntimeError("the cache loader did not finish in %d s" %
                               bound)
        return time.monotonic() - self.nginx_started

    def zones_json(self):
        r = subprocess.run([self.esictl, "--socket", self.esids[self.arm][1],
                            "zones",
                            "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            return {}
        return json.loads(r.stdout)

    def wait_esid_scans(self, complete, bound=1800):
        """Until esid knows every zone and no scan runs; with `complete`,
        until every index is complete.  Returns {zone: seconds}."""
        t0 = time.monotonic()
        done = {}
        names = [z.name for z in self.zones] + ["check"]
        while True:
            zs = self.zones_json()
            for name in names:
                z = zs.get(name)
                if name in done or not z or z["scanning"] or z["scans"] < 1:
                    continue
                if complete and not z["complete"]:
                    raise RuntimeError(
                        "esid's index of %s is not complete after its "
                        "scan: %s" % (name, z))
                done[name] = time.monotonic() - t0
            if len(done) == len(names):
                return done, zs
            if time.monotonic() - t0 > bound:
                raise RuntimeError("esid's scans did not finish: %s" % zs)
            time.sleep(0.1)

    # -- cold page cache -----------------------------------------------

    def drop_caches(self, client, zone):
        """Empties the page cache (and the dentry and inode caches), then
        warms what is not the zone: the code paths of a purge (one of a
        key nowhere in the check zone) and, in the scan arm, the probe's
        keys (the probe measures the worker, not the disk)."""
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        if self.arm == "scan":
            for key in zone.probe:
                client.request("GET", key.decode())
        self.purge(client, "cache_purge" if self.arm == "cache_purge"
                   else "ours", "/check/none")

    def purge(self, client, how, key):
        """(ms, status, count or None) of one purge of `key`."""
        if how == "cache_purge":
            ms, status, hdrs, _ = client.timed("GET", "/cp" + key)
            return ms, status, None
        if how == "pattern":
            # Magento's request, in the key's zone's location
            zone = key.split("/")[1]
            pattern = "^store,%s$" % tag_of(key.encode()).decode()
            ms, status, hdrs, _ = client.timed(
                "PURGE", "/%s/" % zone, {"X-Magento-Tags-Pattern": pattern})
        else:
            ms, status, hdrs, _ = client.timed("PURGE", key)
        m = re.match(r"(?:exact|pattern); count=(\d+)$",
                     hdrs.get("cache-purge-result", ""))
        return ms, status, int(m.group(1)) if m else None


# -- the arms --------------------------------------------------------------------------

def count_paths(text):
    """Purges of the zones' keys (not the check zone's) by path taken."""
    lines = [l for l in text.splitlines()
             if ' purge of "/z' in l or ' purge of "^store,z' in l]
    return {"index": sum(", via variant index" in l for l in lines),
            "scan": sum(", zone directory read" in l for l in lines)}


def purge_series(run, client, zone, how, n, cold, gap=0.0, intervals=None):
    """n purges of fresh Vary'd keys, each after a page-cache drop when
    `cold`, else after `gap` s (at least as long as the last purge took,
    when a gap is asked for: the probe's rest between scans).  Returns
    (ms list, [(key, status, count)], problems)."""
    ms = []
    done = []
    problems = []
    for _ in range(n):
        key = zone.take()
        if cold:
            t_ex = time.perf_counter()
            run.drop_caches(client, zone)
            time.sleep(0.05)
            if intervals is not None:
                intervals.append(("excluded", t_ex, time.perf_counter()))
        elif gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        took, status, count = run.purge(client, how, key.decode())
        t1 = time.perf_counter()
        if intervals is not None:
            intervals.append(("scan", t0, t1))
        ms.append(took)
        done.append((key, status, count))
        if how in ("ours", "pattern"):
            left = zone.on_disk(key)
            if status != 200 or count != 2 or left:
                problems.append("%s: status %d, count %s, %d file(s) left" % (
                    key.decode(), status, count, left))
        elif status != 200:
            problems.append("%s: status %d" % (key.decode(), status))
        if gap and gap < t1 - t0:
            gap = min(t1 - t0, 5.0)
    return ms, done, problems


def classify(samples, intervals, margin=0.005):
    """Probe samples by what overlapped them: {"scan": [ms], "burn": [ms],
    "rest": [ms]}; rest is what overlapped nothing (with a margin), samples
    in an "excluded" stretch (a page-cache drop) count nowhere."""
    out = {"scan": [], "burn": [], "rest": []}
    for t, ms, ok in samples:
        end = t + ms / 1000
        hit = "rest"
        for kind, a, b in intervals:
            if t < b + margin and end > a - margin:
                hit = kind
                break
        if hit in out:
            out[hit].append(ms)
    return out


def burn(seconds, n, gap, intervals):
    """The control for the probe: n stretches of `seconds` during which a
    process of our niceness spins on one core, as esid's scan thread does
    during a warm scan."""
    for _ in range(n):
        time.sleep(gap)
        proc = subprocess.Popen(["sh", "-c", "while :; do :; done"])
        t0 = time.perf_counter()
        time.sleep(seconds)
        proc.kill()
        proc.wait()
        intervals.append(("burn", t0, time.perf_counter()))


def probed_purges(run, zone, how, n, cold):
    """n purges of `how` with the probe running; after warm ones, as many
    stretches as long of a process spinning on a core (the control: what
    any busy process does to the probe).  Returns (ms, problems, what the
    probe saw)."""
    probe = Probe(run.port, zone.probe, run.args.probe_interval / 1000)
    intervals = []
    client = Client(run.port)
    gc.disable()
    probe.start()
    try:
        time.sleep(0.3)
        if not cold:
            ms, _, problems = purge_series(run, client, zone, how, n, False,
                                           gap=0.2, intervals=intervals)
            if ms and not run.args.smoke:
                took = min(percentile(ms, 50) / 1000, 10.0)
                burn(took, n, max(0.2, took), intervals)
        else:
            ms, _, problems = purge_series(run, client, zone, how, n, True,
                                           intervals=intervals)
        time.sleep(0.3)
    finally:
        probe.stop()
        gc.enable()
        client.close()
    by = classify(probe.samples, intervals)
    return ms, problems, {
        "during": by["scan"], "rest": by["rest"], "burn": by["burn"],
        "errors": sum(1 for x in probe.samples if not x[2]),
        "failures": probe.failures, "requests": len(probe.samples)}


def scan_phase(run, client, zone, counts, cache):
    """Purges that read the zone's directory, the probe running."""
    if cache == "warm":
        zone.stats["resident"] = zone.resident()
    n = counts["warm_scans"] if cache == "warm" else counts["cold_scans"]
    ms, problems, seen = probed_purges(run, zone, "ours", n, cache == "cold")
    return {("scan", cache): dict(summary(ms), problems=problems),
            ("probe", cache): seen}


def pattern_phase(run, client, zone, counts, cache):
    """Pattern purges over the zone's index (RE2 over every object), the
    probe running, as in the scan arm."""
    ms, problems, seen = probed_purges(run, zone, "pattern",
                                       counts["patterns"], False)
    return {("pattern", cache): dict(summary(ms), problems=problems),
            ("probe", "pattern"): seen}


def index_phase(run, client, zone, counts, cache):
    """Exact purges answered from esid's index; warm, also of keys never
    cached (404: esid's answer without a file to remove)."""
    out = {}
    gc.disable()
    try:
        if cache == "warm":
            ms, _, problems = purge_series(run, client, zone, "ours",
                                           counts["index"], False, gap=0.002)
            absent, bad = [], []
            for i in range(counts["absent"]):
                time.sleep(0.002)
                took, status, count = run.purge(
                    client, "ours", "/%s/none/%d" % (zone.name, i))
                absent.append(took)
                if status != 404 or count != 0:
                    bad.append("/%s/none/%d: status %d, count %s" % (
                        zone.name, i, status, count))
            out["index", "absent"] = dict(summary(absent), problems=bad)
        else:
            ms, _, problems = purge_series(run, client, zone, "ours",
                                           counts["cold"], True)
    finally:
        gc.enable()
    out["index", cache] = dict(summary(ms), problems=problems)
    return out


def cache_purge_phase(run, client, zone, counts, cache):
    """ngx_cache_purge 2.3's latency; the keys it purged are kept for
    cache_purge_effect()."""
    gc.disable()
    try:
        n = counts["index"] if cache == "warm" else counts["cold"]
        ms, done, problems = purge_series(run, client, zone, "cache_purge",
                                          n, cache == "cold", gap=0.002)
    finally:
        gc.enable()
    return {("cache_purge", cache): dict(summary(ms), problems=problems,
                                         purged=done)}


def cache_purge_effect(run, client, zone, r):
    """What ngx_cache_purge really did: the files of each key it purged
    left on disk (of 2), and, for some keys, the same purge again and a
    request from the client whose variant it left."""
    purged = [x for c in ("warm", "cold")
              for x in r.get(("cache_purge", c), {}).get("purged", [])]
    left = sum(zone.on_disk(key) for key, _, _ in purged)
    again, stale = {}, 0
    # (Not in the smoke: before the cache loader ran, NGINX does not serve
    # a file whose node a Vary mismatch created, whatever the purge did.)
    sample = [] if run.args.smoke else [key for key, _, _ in purged[:20]]
    for key in sample:
        _, status, _ = run.purge(client, "cache_purge", key.decode())
        again[status] = again.get(status, 0) + 1
        status, hdrs, body = client.request(
            "GET", key.decode(), {"Accept-Encoding": "gzip"})
        if hdrs.get("x-cache-status") == "HIT" and \
                body == body_of(key, b"gzip"):
            stale += 1
    return {
        "purges": len(purged),
        "ok": sum(1 for _, st, _ in purged if st == 200),
        "files_before": 2 * len(purged), "files_left": left,
        "removed_per_purge": (2 * len(purged) - left) / len(purged)
        if purged else float("nan"),
        "again": again, "again_n": len(sample), "stale_hits": stale}


def probe_summary(r):
    """The probe's samples of both scan phases: at rest (pooled), during
    warm scans, during cold scans."""
    phases = [r[k] for k in (("probe", "warm"), ("probe", "cold")) if k in r]
    if not phases:
        return None
    rest = [x for p in phases for x in p["rest"]]
    out = {"rest": summary(rest),
           "burn": summary([x for p in phases for x in p["burn"]]),
           "errors": sum(p["errors"] for p in phases),
           "requests": sum(p["requests"] for p in phases),
           "failures": [f for p in phases for f in p["failures"]][:5]}
    for cache in ("warm", "cold"):
        p = r.get(("probe", cache))
        out[cache] = summary(p["during"] if p else [])
    return out


# -- checks before timing ----------------------------------------------------------------

def check_format(run, client):
    """NGINX itself stores a Vary'd and a plain key in the check zone; the
    generator must write the same names and header fields.  And the
    generated zones must answer HITs, both variants."""
    problems = []
    for key, vary in ((b"/check/p", False), (b"/check/v", True)):
        for ae in (("gzip", "") if vary else ("",)):
            h = {"Accept-Encoding": ae} if ae else {}
            status, hdrs, _ = client.request("GET", key.decode(), h)
            if status != 200:
                problems.append("%s: status %d" % (key.decode(), status))
    # NGINX writes the file when the response is complete: wait for it.
    want = 3
    poll(lambda: sum(len(f) for _, _, f in os.walk(run.check)) >= want, 5)
    for key, vary in ((b"/check/p", False), (b"/check/v", True)):
        why = compare_with_nginx(run.check, key, vary)
        if why:
            problems.append("generated %s differs from NGINX's: %s" % (
                key.decode(), why))
    for z in run.zones:
        key = vary_key(z.name, z.unused[0])
        for value in VARIANTS:
            h = {"Accept-Encoding": value.decode()} if value else {}
            status, hdrs, body = client.request("GET", key.decode(), h)
            if status != 200 or hdrs.get("x-cache-status") != "HIT" or \
                    body != body_of(key, value):
                problems.append("%s (Accept-Encoding %r): %s %s %r" % (
                    key.decode(), value, status, hdrs.get("x-cache-status"),
                    body[:60]))
        key = z.probe[0]
        status, hdrs, body = client.request("GET", key.decode())
        if status != 200 or hdrs.get("x-cache-status") != "HIT" or \
                body != body_of(key):
            problems.append("%s: %s %s" % (key.decode(), status,
                                           hdrs.get("x-cache-status")))
    return problems


# -- the file system -----------------------------------------------------------------------

class Filesystem:
    """A fresh ext4 (with a journal) on a loop device over a sparse file."""

    def __init__(self, tmp, files):
        self.image = os.path.join(tmp, "zones.img")
        self.mnt = os.path.join(tmp, "zones")
        self.dev = None
        self.mounted = False
        self.inodes = int(files * 1.2) + 20000
        self.size_mb = max(1024, int((files * 5 + self.inodes * 0.3)
                                     / 1024) + 1024)

    def make(self):
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size_mb * 2 ** 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(self.inodes),
                        "-E", "lazy_itable_init=0,lazy_journal_init=0,"
                        "nodiscard", self.image], check=True,
                       capture_output=True)
        self.dev = subprocess.run(
            ["losetup", "--find", "--show", "--direct-io=on", self.image],
            check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", "-t", "ext4", self.dev, self.mnt],
                       check=True, capture_output=True)
        self.mounted = True
        return self.mnt

    def remove(self):
        if self.mounted:
            subprocess.run(["umount", self.mnt], capture_output=True)
            self.mounted = False
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            self.dev = None
        if os.path.exists(self.image):
            os.unlink(self.image)


# -- results ---------------------------------------------------------------------------------

ROWS = (("scan", "warm"), ("scan", "cold"), ("index", "warm"),
        ("index", "absent"), ("index", "cold"), ("pattern", "warm"),
        ("cache_purge", "warm"), ("cache_purge", "cold"))
ARM_LABEL = {"scan": "ours, zone directory read (`esi_purge_index off`)",
             "index": "ours, variant index",
             "pattern": "ours, tag pattern (RE2 over the variant index)",
             "cache_purge": "ngx_cache_purge 2.3"}


def purge_rows(zones, res):
    """(zone, arm, page cache, summary) of every purge row measured."""
    for z in zones:
        for arm, cache in ROWS:
            s = res[z.name].get((arm, cache))
            if s:
                yield z, arm, cache, s


def removed_per_purge(r, arm, cache):
    """Files each purge of the row removed: what our purges must remove
    (checked on disk, else a problem), ngx_cache_purge's as counted."""
    if arm == "cache_purge":
        return r["cache_purge", "what"]["removed_per_purge"]
    return 0 if cache == "absent" else 2


def table_head(L, header, align):
    """A markdown table's header row and its alignment row (one letter a
    column: r right, l left)."""
    L.append(header)
    L.append("|" + "".join("---:|" if a == "r" else "---|" for a in align))


def ms_(v):
    return fmt_ms(v)


def ratio_(a, b):
    try:
        return "%.0fx" % (a / b) if a / b >= 10 else "%.1fx" % (a / b)
    except (TypeError, ZeroDivisionError):
        return "n/a"


def markdown(args, info, zones, res, meta):
    L = []
    L.append("## purge run, %s" % meta["started"].strftime("%Y-%m-%d %H:%M"))
    L.append("")
    L.append(
        "Machine: %(nproc)d cores, %(cpu)s, %(memory)s, Linux %(kernel)s; "
        "nginx %(nginx)s, ngx_cache_purge 2.3 (Debian). Measured: "
        "%(product)s." % info + " Load average %s before, %s after; run "
        "took %d s. Zones on %s. One nginx, `worker_processes 1`; purges "
        "and probe on 127.0.0.1, one request at a time, keep-alive."
        % (meta["load_before"], meta["load_after"], meta["elapsed"],
           meta["fs"]) + ("" if len(meta["groups"]) < 2 else
                          " Zones measured together, each group with a file "
                          "system and an nginx of its own, one group after "
                          "the other: %s files." % "; then ".join(
                              meta["groups"])))
    L.append("")
    L.append("### Exact purge of a Vary'd key (2 files), milliseconds")
    L.append("")
    table_head(L, "| files | arm | page cache | purges | p50 | p99 | max | "
               "files removed / purge |", "rllrrrrr")
    for z, arm, cache, s in purge_rows(zones, res):
        if s["problems"]:
            removed = "**%d wrong**" % len(s["problems"])
        else:
            removed = "%.3g" % removed_per_purge(res[z.name], arm, cache)
        label = ARM_LABEL[arm]
        if cache == "absent":
            label, cache = label + ", key not cached", "warm"
        L.append("| %s | %s | %s | %d | %s | %s | %s | %s |" % (
            "{:,}".format(z.files), label, cache, s["n"], ms_(s["p50"]),
            ms_(s["p99"]), ms_(s["max"]), removed))
    L.append("")
    L.append("Ratios of the p50s (scan / index: what the index saves; "
             "index / ngx_cache_purge: what finding every variant costs "
             "over removing one):")
    L.append("")
    table_head(L, "| files | page cache | scan / index | "
               "index / ngx_cache_purge | scan / ngx_cache_purge |", "rlrrr")
    for z in zones:
        r = res[z.name]
        for cache in ("warm", "cold"):
            s, i, c = (r.get((a, cache)) for a in
                       ("scan", "index", "cache_purge"))
            if not (s and i and c):
                continue
            L.append("| %s | %s | %s | %s | %s |" % (
                "{:,}".format(z.files), cache, ratio_(s["p50"], i["p50"]),
                ratio_(i["p50"], c["p50"]), ratio_(s["p50"], c["p50"])))
    L.append("")
    L.append("### Ordinary requests on the same worker during the scans")
    L.append("")
    L.append("Cache HITs on %d other keys of the zone being scanned, one at "
             "a time, one every %g ms on one keep-alive connection, "
             "throughout the scan arm; a sample counts as \"during\" when it "
             "overlaps a purge, as \"at rest\" when it overlaps nothing (nor "
             "a page-cache drop). The control: after the warm scans, as many "
             "stretches as long as one (at most 10 s), each with a process "
             "of the same niceness spinning on one core, as the scan thread "
             "does. "
             "Milliseconds, p50 / p99 / max (samples):" % (
                 PROBE_KEYS, args.probe_interval))
    L.append("")
    table_head(L, "| files | at rest | during warm scans | during cold scans "
               "| while a process spins (control) | p99 during warm scans / "
               "at rest, / control | failed requests |", "rrrrrrr")
    def cell(s):
        if not s["n"]:
            return "n/a"
        return "%s / %s / %s (%d)" % (ms_(s["p50"]), ms_(s["p99"]),
                                      ms_(s["max"]), s["n"])

    for z in zones:
        p = res[z.name].get("probe")
        if not p:
            continue
        L.append("| %s | %s | %s | %s | %s | %s / %s | %d of %d |" % (
            "{:,}".format(z.files), cell(p["rest"]), cell(p["warm"]),
            cell(p["cold"]), cell(p["burn"]),
            ratio_(p["warm"]["p99"], p["rest"]["p99"]),
            ratio_(p["warm"]["p99"], p["burn"]["p99"]), p["errors"],
            p["requests"]))
    L.append("")
    patterned = [(z, res[z.name][("probe", "pattern")]) for z in zones
                 if ("probe", "pattern") in res[z.name]]
    if patterned:
        L.append("The same probe during the pattern arm's purges (RE2 over "
                 "the index), milliseconds p50 / p99 / max (samples):")
        L.append("")
        table_head(L, "| files | at rest | during pattern purges | while a "
                   "process spins (control) | failed requests |", "rrrrr")
        for z, p in patterned:
            L.append("| %s | %s | %s | %s | %d of %d |" % (
                "{:,}".format(z.files), cell(summary(p["rest"])),
                cell(summary(p["during"])), cell(summary(p["burn"])),
                p["errors"], p["requests"]))
        L.append("")
    L.append("### What ngx_cache_purge 2.3 removed")
    L.append("")
    table_head(L, "| files | purges | answered 200 | Vary files on disk "
               "before | left after | the same purge again | HITs for the "
               "other client afterwards |", "rrrrrlr")
    for z in zones:
        w = res[z.name].get(("cache_purge", "what"))
        if not w:
            continue
        again = ", ".join("%d x %d" % (n, st) for st, n in
                          sorted(w["again"].items()))
        L.append("| %s | %d | %d | %d | %d | %s (of %d) | %d of %d |" % (
            "{:,}".format(z.files), w["purges"], w["ok"],
            w["files_before"], w["files_left"], again, w["again_n"],
            w["stale_hits"], w["again_n"]))
    L.append("")
    L.append("### The zones")
    L.append("")
    table_head(L, "| files | keys | Vary'd keys | generated in | files/s | "
               "keys_zone | NGINX loader done after | esid index build | "
               "esid index memory | in the page cache before the warm scans "
               "|", "rrrrrrrrrr")
    for z in zones:
        st = z.stats
        L.append("| %s | %s | %s | %.1f s (+ sync %.1f s) | %s | %d MB | "
                 "%s | %s | %s | %s |" % (
                     "{:,}".format(z.files), "{:,}".format(z.keys),
                     "{:,}".format(z.vary), st["gen_s"], st["sync_s"],
                     "{:,.0f}".format(z.files / st["gen_s"]),
                     z.keys_zone_mb,
                     "%.0f s" % st["loader_s"] if st.get("loader_s")
                     else "n/a",
                     "%.1f s" % st["index_build_s"]
                     if "index_build_s" in st else "n/a",
                     "%.1f MB" % (st["index_bytes"] / 2 ** 20)
                     if "index_bytes" in st else "n/a",
                     "%.0f%%" % (100 * st["resident"])
                     if st.get("resident") is not None else "n/a"))
    L.append("")
    goal = []
    big = zones[-1]
    i = res[big.name].get(("index", "warm"))
    if i:
        goal.append("indexed purge p50 at %s files: %s ms (goal < 1 ms: "
                    "%s)" % ("{:,}".format(big.files), ms_(i["p50"]),
                             "met" if i["p50"] < 1 else "**not met**"))
    worst = []
    for z in zones:
        p = res[z.name].get("probe") or {}
        for c in ("warm", "cold") if p else ():
            if p[c]["n"]:
                worst.append((p[c]["p99"] / p["rest"]["p99"], z, c, p))
    if worst:
        w = max(worst, key=lambda x: x[0])
        p = w[3]
        goal.append(
            "worker request p99 during scans at most %.2fx of at rest (%s "
            "files, %s scans; %s ms against %s ms; with a process spinning "
            "instead: %s ms); the longest request during any scan took %s ms,"
            " while the scans took %s ms and more" % (
                w[0], "{:,}".format(w[1].files), w[2], ms_(p[w[2]]["p99"]),
                ms_(p["rest"]["p99"]), ms_(p["burn"]["p99"]),
                ms_(max(x[3][c]["max"] for x in worst
                        for c in ("warm", "cold") if x[3][c]["n"])),
                ms_(min(res[z.name]["scan", "warm"]["p50"] for z in zones
                        if ("scan", "warm") in res[z.name]))))
    if goal:
        L.append("Goals: " + "; ".join(goal) + ".")
        L.append("")
    problems = meta["problems"]
    if problems:
        L.append("Problems seen:")
        L.append("")
        for p in problems[:30]:
            L.append("- " + p)
        L.append("")
    return "\n".join(L)


def plot_latency(csv_path):
    """The picture of a purge run's CSV: the median latency of an exact
    purge against the zone's size, one line per arm and page cache, both
    axes logarithmic; results/DATE-purge*-latency.png, or None."""
    lines = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["what"] != "purge" or row["page_cache"] not in ("warm", "cold"):
                continue
            arm = ARM_LABEL.get(row["arm"], row["arm"]).replace("`", "")
            label = "%s, %s page cache" % (arm, row["page_cache"])
            lines.setdefault(label, []).append((int(row["files"]),
                                                float(row["p50_ms"])))
    if not lines:
        return None
    png = csv_path[:-4] + "-latency.png"
    dat = csv_path[:-4] + "-latency.dat"
    with open(dat, "w") as f:
        for label, points in sorted(lines.items()):
            f.write('"%s"\n' % label)
            for files, ms in sorted(points):
                f.write("%d %.3f\n" % (files, ms))
            f.write("\n\n")
    script = """
set terminal pngcairo size 900,680 noenhanced font ",10"
set output '%s'
set title "Exact purge of a Vary'd key (2 files): median latency against zone size"
set logscale xy
set xlabel 'files in the zone (log scale)'
set ylabel 'ms, median (log scale)'
set xtics ('1k' 1000, '10k' 10000, '100k' 100000, '1M' 1000000)
set xrange [5000:2000000]
set format y '%%g'
set key below horizontal maxcols 2 width -8
set grid
plot for [i=0:%d] '%s' index i using 1:2 with linespoints title columnheader(1)
""" % (png, len(lines) - 1, dat)
    made = reporting.gnuplot(script)
    os.unlink(dat)
    return png if made else None


def write_csv(path, zones, res):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["files", "what", "arm", "page_cache", "n", "p50_ms",
                    "p99_ms", "max_ms", "mean_ms", "files_removed_per_purge",
                    "notes"])
        for z, arm, cache, s in purge_rows(zones, res):
            w.writerow([z.files, "purge", arm, cache, s["n"],
                        "%.3f" % s["p50"], "%.3f" % s["p99"],
                        "%.3f" % s["max"], "%.3f" % s["mean"],
                        "" if s["problems"] else
                        "%.3f" % removed_per_purge(res[z.name], arm, cache),
                        "; ".join(s["problems"])[:500]])
        for z in zones:
            r = res[z.name]
            p = r.get("probe")
            for phase in ("rest", "warm", "cold", "burn") if p else ():
                s = p[phase]
                w.writerow([z.files, "probe", "scan",
                            {"rest": "at rest", "warm": "during warm scans",
                             "cold": "during cold scans",
                             "burn": "while a process spins"}[phase], s["n"],
                            "%.3f" % s["p50"], "%.3f" % s["p99"],
                            "%.3f" % s["max"], "%.3f" % s["mean"], "",
                            "%d failed of %d" % (p["errors"],
                                                 p["requests"])])
            wh = r.get(("cache_purge", "what"))
            if wh:
                w.writerow([z.files, "cache_purge_files", "cache_purge", "",
                            wh["purges"], "", "", "", "",
                            "%.3f" % wh["removed_per_purge"],
                            "%d of %d files left; again: %s; %d of %d HITs "
                            "for the other client" % (
                                wh["files_left"], wh["files_before"],
                                wh["again"], wh["stale_hits"],
                                wh["again_n"])])


def write_samples(path, zones, res):
    """Every purge's latency, in the order they were sent."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["files", "arm", "page_cache", "seq", "ms"])
        for z, arm, cache, s in purge_rows(zones, res):
            for i, ms in enumerate(s["ms"]):
                w.writerow([z.files, arm, cache, i, "%.3f" % ms])


# -- main --------------------------------------------------------------------------------------

ARMS = {"scan": scan_phase, "index": index_phase,
        "pattern": pattern_phase, "cache_purge": cache_purge_phase}
# The arms of our module, each with an esid of its own.
OURS = ("scan", "index", "pattern")

# Warm first, while nothing has emptied the page cache; then cold, each
# purge after a drop.  The index arm's cold phase follows its warm one
# (leaving the index arm loses esid's index), and the scan arm comes back
# last (its esid is kept, so coming back reads no directory).
PHASES = (("scan", "warm"), ("cache_purge", "warm"), ("index", "warm"),
          ("index", "cold"), ("pattern", "warm"), ("cache_purge", "cold"),
          ("scan", "cold"))


def run_phase(run, arm, cache, zones, res, meta):
    """One arm, warm or cold, on every zone; returns the problems seen."""
    problems = []
    first = run.nginx is None
    run.enter(arm, meta)
    client = Client(run.port)
    if first:
        bad = check_format(run, client)
        if bad:
            raise RuntimeError("format check failed:\n" + "\n".join(bad))
        log("format check: generated files match NGINX's own; HITs for "
            "both variants")
    at = os.path.getsize(run.errlog)
    for z in zones:
        r = ARMS[arm](run, client, z, counts_for(z.files, run.args.smoke),
                      cache)
        res[z.name].update(r)
        s = r[arm, cache]
        parts = ["p50 %s ms, p99 %s ms (%d)" % (ms_(s["p50"]), ms_(s["p99"]),
                                               s["n"])]
        for k, v in r.items():
            if isinstance(v, dict) and "problems" in v:
                problems += ["%s %s %s: %s" % (z.name, k[0], k[1], x)
                             for x in v["problems"]]
        if ("index", "absent") in r:
            a = r["index", "absent"]
            parts.append("of a key not cached p50 %s ms, p99 %s ms (%d)" % (
                ms_(a["p50"]), ms_(a["p99"]), a["n"]))
        pr = r.get(("probe", "pattern" if arm == "pattern" else cache))
        if pr:
            d, rest = summary(pr["during"]), summary(pr["rest"])
            parts.append("probe p50/p99 during the purges %s/%s ms, between "
                         "them %s/%s ms" % (ms_(d["p50"]), ms_(d["p99"]),
                                            ms_(rest["p50"]),
                                            ms_(rest["p99"])))
            if pr["burn"]:
                bu = summary(pr["burn"])
                parts.append("while a process spins %s/%s ms" % (
                    ms_(bu["p50"]), ms_(bu["p99"])))
            if pr["errors"]:
                problems.append("%s probe: %d failed requests: %s" % (
                    z.name, pr["errors"], pr["failures"]))
        log("%s %s %s: %s" % (z.name, arm, cache, "; ".join(parts)))
    if arm == "cache_purge" and (cache == "cold" or not run.args.cold):
        for z in zones:
            w = cache_purge_effect(run, client, z, res[z.name])
            res[z.name]["cache_purge", "what"] = w
            log("%s cache_purge: %d of %d Vary files left after %d purges; "
                "the same purge again: %s; %d of %d HITs for the other "
                "client" % (z.name, w["files_left"], w["files_before"],
                            w["purges"], w["again"], w["stale_hits"],
                            w["again_n"]))
    client.close()
    # Which path each purge of a zone key took, per the error log.
    paths = count_paths(run.log_since(at))
    if arm == "scan" and paths["index"]:
        problems.append("scan arm: %d purge(s) answered via the index with "
                        "esi_purge_index off" % paths["index"])
    if arm in ("index", "pattern") and paths["scan"]:
        problems.append("index arm: %d purge(s) read the zone's directory "
                        "although the index was complete" % paths["scan"])
    return problems


def counts_for(files, smoke):
    """Purges per phase: scans warm and cold, index / ngx_cache_purge warm
    and cold.  A cold scan reads every file from disk (about 1 ms a file
    here): the counts keep the run in minutes."""
    if smoke:
        return {"warm_scans": 1, "cold_scans": 0, "index": 1, "cold": 0,
                "absent": 1, "patterns": 1}
    if files >= 1000000:
        return {"warm_scans": 3, "cold_scans": 1, "index": 200, "cold": 10,
                "absent": 50, "patterns": 20}
    if files >= 100000:
        return {"warm_scans": 10, "cold_scans": 2, "index": 200, "cold": 10,
                "absent": 50, "patterns": 20}
    if files < 10000:
        return {"warm_scans": 5, "cold_scans": 2, "index": 20, "cold": 5,
                "absent": 10, "patterns": 5}
    return {"warm_scans": 20, "cold_scans": 3, "index": 200, "cold": 10,
                "absent": 50, "patterns": 20}


def cold_possible():
    if os.geteuid() != 0:
        return "not root"
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("1\n")
    except OSError as e:
        return str(e)
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir")
    p.add_argument("--plot", metavar="CSV",
                   help="only draw the picture of an earlier run's CSV "
                        "(results/DATE-purge*.csv) and exit")
    p.add_argument("--product", default="?")
    p.add_argument("--sizes", default="10k,100k",
                   help="zone sizes, of %s; '+' separates groups measured "
                   "one after the other (10k,100k+1m)" % ",".join(SIZES))
    p.add_argument("--smoke", action="store_true",
                   help="1k files, one purge each way, counts checked, no "
                   "timing")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--probe-interval", type=float, default=1.0,
                   help="ms between the probe's requests")
    p.add_argument("--gen-jobs", type=int, default=2)
    p.add_argument("--no-cold", action="store_true")
    p.add_argument("--arms", default="scan,index,pattern,cache_purge",
                   help="which arms to measure (the order of the phases is "
                   "fixed)")
    p.add_argument("--no-mount", action="store_true",
                   help="zones in the temporary directory, not on an ext4 "
                   "of their own")
    p.add_argument("--index-size",
                   help="esi_purge_index of the index arm (default: room "
                   "for the largest zone)")
    p.add_argument("--nice", type=int, default=-10,
                   help="niceness of nginx, esid and the clients (they "
                   "inherit it), so that other load on the machine "
                   "disturbs the timing less; 0: leave it")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    if args.plot:
        png = plot_latency(args.plot)
        print(png or "no picture (gnuplot-nox missing, or no purge rows)")
        return 0 if png else 1
    if not args.build_dir:
        p.error("--build-dir is required")
    args.build_dir = os.path.abspath(args.build_dir)
    for f in ("esid", "esictl", "ngx_http_esi_module.so"):
        if not os.path.exists(os.path.join(args.build_dir, f)):
            p.error("%s/%s missing" % (args.build_dir, f))
    if not os.path.exists(CACHE_PURGE_MODULE):
        p.error("%s missing: apt-get install libnginx-mod-http-cache-purge"
                % CACHE_PURGE_MODULE)
    if args.smoke:
        args.sizes = "1k"
        args.no_cold = args.no_mount = args.no_readme = True
    # "10k,100k+1m": 10k and 100k measured together, then 1M on its own
    # (a file system and an nginx of its own: it does not fit in this
    # machine's page cache beside the others).
    groups = [[s.strip().lower() for s in g.split(",") if s.strip()]
              for g in args.sizes.split("+")]
    groups = [g for g in groups if g]
    args.workers = "1"     # running.Servers's nginx: one worker
    labels = [s for g in groups for s in g]
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in args.arms:
        if a not in ARMS:
            p.error("unknown arm %s" % a)
    for s in labels:
        if s not in SIZES:
            p.error("unknown size %s" % s)
    why_not_cold = None if args.no_cold else cold_possible()
    args.cold = not args.no_cold and why_not_cold is None
    if why_not_cold:
        log("cold page cache not measured: writing %s: %s" % (
            DROP_CACHES, why_not_cold))

    exit_on_signals()

    started = datetime.datetime.now()
    t_start = time.monotonic()
    load_before = loadavg()
    problems = []
    zones, res, fs_labels = [], {}, []
    for group in groups:
        z, r, fs_label = measure_group(args, group, problems)
        zones += z
        res.update(r)
        fs_labels.append(fs_label)
    if args.smoke:
        log("smoke: %d problem(s) (%d s)" % (len(problems),
                                              time.monotonic() - t_start))
        for x in problems:
            log("  " + x)
        return 0 if not problems else 1

    meta = {"started": started, "problems": problems,
            "fs": "; ".join(sorted(set(fs_labels))),
            "groups": [", ".join("{:,}".format(SIZES[s]) for s in g)
                       for g in groups],
            "elapsed": time.monotonic() - t_start,
            "load_before": load_before, "load_after": loadavg()}
    info = machine_info(args)
    md = markdown(args, info, zones, res, meta)
    os.makedirs(args.results, exist_ok=True)
    mode = "purge-full" if any(z.files >= 1000000 for z in zones) \
        else "purge"
    base = os.path.join(args.results, "%s-%s" % (
        started.strftime("%Y-%m-%d"), mode))
    with open(base + ".md", "w") as f:
        f.write(md)
    write_csv(base + ".csv", zones, res)
    write_samples(base + "-samples.csv", zones, res)
    print()
    print(md)
    png = plot_latency(base + ".csv")
    log("results: %s.md, %s.csv, %s-samples.csv%s" % (
        base, base, base, ", " + png if png else ""))
    if not args.no_readme:
        update_readme(md, [png] if png else [], marker="purge",
                      raw=(base + ".csv", base + "-samples.csv"))
    return 0


@contextlib.contextmanager
def zone_space(args, files):
    """A Servers (its temporary directory holds everything) and where zones
    of `files` files in all go: an ext4 of their own as root (unless
    --no-mount), else the temporary directory.  Yields (servers, root,
    what the root is); on the way out everything is stopped and removed,
    the directory kept (logs, configs) after a failure or with --keep."""
    fs = None
    ok = False
    bench = Servers(args)
    try:
        if args.no_mount or os.geteuid() != 0:
            root = os.path.join(bench.tmp, "zones")
            os.makedirs(root)
            label = "the temporary directory's file system"
        else:
            fs = Filesystem(bench.tmp, files)
            root = fs.make()
            label = ("a fresh ext4 (journal; sparse image, loop device "
                     "with direct I/O)")
        yield bench, root, label
        ok = True
    finally:
        bench.stop()
        if fs is not None:
            fs.remove()
        bench.finish(ok, args.keep)


def measure_group(args, labels, problems):
    """Zones measured together (one file system, one nginx): generated,
    loaded, every phase; returns (zones, results, file system label)."""
    with zone_space(args, sum(SIZES[s] for s in labels)) as (
            bench, root, fs_label):
        zones = [Zone(s, SIZES[s], root) for s in labels]
        for z in zones:
            c = counts_for(z.files, args.smoke)
            if c["warm_scans"] + c["cold_scans"] + c["patterns"] + 2 * (
                    c["index"] + c["cold"]) > z.vary:
                raise RuntimeError("%s: too few Vary'd keys" % z.name)
        for z in zones:
            z.generate(args.gen_jobs if z.files >= 100000 else 1)
            log("%s: %d files (%d keys, %d Vary'd) written in %.1f s "
                "(%.0f files/s), sync %.1f s" % (
                    z.name, z.files, z.keys, z.vary, z.stats["gen_s"],
                    z.files / z.stats["gen_s"], z.stats["sync_s"]))
        niced = False
        if args.nice and not args.smoke:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, args.nice)
                niced = True
            except OSError as e:
                log("cannot set niceness %d: %s" % (args.nice, e))
        run = Run(args, bench, zones, root)
        res = {z.name: {} for z in zones}
        meta = {}
        for arm, cache in PHASES:
            if arm in args.arms and (cache == "warm" or args.cold):
                problems += run_phase(run, arm, cache, zones, res, meta)
        for z in zones:
            res[z.name]["probe"] = probe_summary(res[z.name])
            z.stats["loader_s"] = meta.get("loader_s")
        if not run.nginx.alive():
            raise RuntimeError("nginx died during the run")
        if niced:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        return zones, res, fs_label


if __name__ == "__main__":
    sys.exit(main())
