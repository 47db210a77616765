"""The benchmark's running: the targets (NGINX + the module + esid, Varnish,
NGINX SSI, NGINX without ESI, the origin, the page gzipped ahead of time)
started from the workload's pages,
each answer checked byte for byte, wrk runs with the CPU the target's
processes spent, and the matrices measured in interleaved rounds.

`Servers` (a temporary directory, the processes started in it, nginx's of
their own) is what bench.py's Bench and purge.py's Run start things with.
"""

import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import zlib

import support_path  # noqa: F401  (tests/support on sys.path)
from esitest import (NGINX, DidNotStart, Process, descendants, fill,
                     start_nginx, start_on_port, start_on_socket)
from reporting import ARM_LABEL, log, print_row
from workload import (COST_ARMS, COST_FRAGMENT, DELAYS, LANG_ARMS,
                      LANG_HEADERS, MAIN_ARMS, fragment_body, main_pages,
                      row_label, write_pages)

VARNISHD = os.environ.get("ESI_VARNISHD", "/usr/sbin/varnishd")
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids):
    """utime + stime of these processes (all their threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK



# -- configurations --------------------------------------------------------------

NGINX_MAIN = """\
@@USER@@
worker_processes @@WORKERS@@;
master_process on;
pid @@DIR@@/nginx.pid;
error_log @@DIR@@/error.log @@LOG_LEVEL@@;
@@MODULES@@

events {
    worker_connections 8192;
}

http {
    types { text/html html; }
    default_type text/html;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;

    client_body_temp_path @@DIR@@/client_body;
    proxy_temp_path @@DIR@@/proxy_temp;
    fastcgi_temp_path @@DIR@@/fastcgi_temp;
    uwsgi_temp_path @@DIR@@/uwsgi_temp;
    scgi_temp_path @@DIR@@/scgi_temp;

@@HTTP@@
}
"""

# Everything the three NGINX targets share: the origin upstream with
# keep-alive, plaintext from the origin (gzip is done here, for the client,
# at Varnish's default level 6), the page shells in a proxy_cache, the
# fragments uncached.
TARGET_HTTP = """\
    log_format bench '$status @@STATUS@@';
    access_log @@DIR@@/access.log bench;

    upstream origin {
        server 127.0.0.1:@@ORIGIN@@;
        keepalive 128;
    }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Accept-Encoding "";
    proxy_cache_path @@DIR@@/cache keys_zone=pages:16m max_size=1g;
    open_file_cache max=1000;       # as README's configuration, every arm

    gzip on;
    gzip_comp_level 6;
    # gzip_types: text/html only, the default

@@EXTRA@@

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;

        location @@PAGES@@ {
            proxy_pass http://origin;
            proxy_cache pages;
            proxy_cache_valid 200 1h;
@@PAGE_DIRECTIVES@@
        }

        location /cost/ {
            proxy_pass http://origin;
            proxy_cache pages;
            proxy_cache_valid 200 1h;
@@PAGE_DIRECTIVES@@
        }

        location /lang/ {
            proxy_pass http://origin;
            proxy_cache pages;
            proxy_cache_valid 200 1h;
@@PAGE_DIRECTIVES@@
        }

        location ~ "^/f[0-9]+/" {
            proxy_pass http://origin;
        }

        location /cf/ {
            return 200 '@@COST_FRAGMENT@@';
        }
    }
"""

ORIGIN_HTTP = """\
    access_log off;
    open_file_cache max=1000;

    server {
        listen 127.0.0.1:@@PORT@@ backlog=4096;
        root @@DIR@@/www;

        location / {
        }
@@LOCATIONS@@
    }
"""

VCL = """\
vcl 4.1;

backend origin {
    .host = "127.0.0.1";
    .port = "@@ORIGIN@@";
}

sub vcl_recv {
    # Fragments are uncached, as in every other arm.
    if (req.url ~ "^/f[0-9]+/") {
        return (pass);
    }
}

sub vcl_backend_response {
    if (bereq.url ~ "^/esi/") {
        set beresp.do_esi = true;
        set beresp.do_gzip = true;
        set beresp.ttl = 1h;
    }
}
"""


class Target:
    """One server under test: its processes, port and URL scheme."""

    def __init__(self, name, port, procs):
        self.name = name
        self.port = port
        self.procs = procs

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def pids(self):
        return descendants([p.pid for p in self.procs if p.alive()])

    def alive(self):
        return all(p.alive() for p in self.procs)


class Servers:
    """A temporary directory, the processes started in it (stopped in the
    reverse order), and nginx's of their own in its subdirectories."""

    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="esi-bench-")
        self.procs = []

    def spawn(self, name, argv, env=None):
        proc = Process(name, argv, self.tmp, env)
        self.procs.append(proc)
        return proc

    def nginx_text(self, name, http, modules, port, log_level="warn"):
        """The nginx.conf of tmp/name: NGINX_MAIN around `http`."""
        return fill(NGINX_MAIN, {
            "USER": "user root;" if os.geteuid() == 0 else "",
            "WORKERS": self.args.workers,
            "DIR": os.path.join(self.tmp, name),
            "LOG_LEVEL": log_level,
            "MODULES": modules,
            "HTTP": http.replace("@@PORT@@", str(port)),
        })

    def nginx_conf(self, name, http, modules, port, log_level="warn"):
        """Writes tmp/name/nginx.conf (for a reload); returns its path."""
        path = os.path.join(self.tmp, name, "nginx.conf")
        with open(path, "w") as f:
            f.write(self.nginx_text(name, http, modules, port, log_level))
        return path

    def nginx(self, name, http, modules="", log_level="warn"):
        """An nginx of its own in tmp/name; returns (process, port)."""
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        try:
            return start_nginx(self.spawn, name, d, lambda port:
                               self.nginx_text(name, http, modules, port,
                                               log_level))
        except DidNotStart as e:
            raise RuntimeError("%s did not start:\n%s" % (name,
                                                         e.log[-3000:]))

    def esid(self, name, socket, *args):
        """esid on the Unix socket `socket`, once it answers there."""
        try:
            return start_on_socket(self.spawn, name, [
                os.path.join(self.args.build_dir, "esid"), "--socket",
                socket] + list(args), socket)
        except DidNotStart as e:
            raise RuntimeError("esid did not start:\n" + e.log[-4000:])

    def stop(self):
        for proc in reversed(self.procs):
            proc.stop()
        self.procs = []

    def finish(self, ok, keep):
        """Stops everything; removes the temporary directory after a
        successful run unless asked to keep it."""
        self.stop()
        if ok and not keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            log("logs kept in %s" % self.tmp)


class Bench(Servers):
    """The targets of the matrices, on the workload's pages."""

    def __init__(self, args):
        super().__init__(args)
        self.targets = {}
        self.problems = []

    def start(self):
        self.expected, self.urls = write_pages(
            os.path.join(self.tmp, "origin", "www"))
        a = self.args

        # The origin.
        frags = []
        for d in DELAYS:
            sleep = "echo_sleep %.3f; " % (d / 1000.0) if d else ""
            frags.append("        location /f%d/ { %secho "
                         "'<div class=\"frag\">$uri</div>'; }" % (d, sleep))
        http = fill(ORIGIN_HTTP, {
            "DIR": os.path.join(self.tmp, "origin"),
            "LOCATIONS": "\n".join(frags)}, strict=False)
        proc, self.origin_port = self.nginx(
            "origin", http, "load_module %s;" % ECHO_MODULE)
        self.targets["origin"] = Target("origin", self.origin_port, [proc])
        log("origin   on 127.0.0.1:%d" % self.origin_port)

        module = os.path.join(a.build_dir, "ngx_http_esi_module.so")
        sock = self.esid_socket = os.path.join(self.tmp, "esid.sock")

        def target_http(name, pages, page_directives, extra, status):
            return fill(TARGET_HTTP, {
                "DIR": os.path.join(self.tmp, name),
                "ORIGIN": self.origin_port,
                "PAGES": pages,
                "PAGE_DIRECTIVES": page_directives,
                "EXTRA": extra,
                "STATUS": status,
                "COST_FRAGMENT": COST_FRAGMENT.decode().replace("\n", "\\n"),
            }, strict=False)

        # Ours: esid, then nginx with the module.
        esid = self.esid("esid", sock, "--log-level", "warn")
        http = target_http("esi", "/esi/",
                           "            esi on;\n            esi_plan off;",
                           "    esi_daemon unix:%s;\n"
                           "    esi_cookies user theme;" % sock, "$esi_status")
        proc, port = self.nginx("esi", http, "load_module %s;" % module)
        self.targets["esi"] = Target("esi", port, [proc, esid])
        log("esi      on 127.0.0.1:%d (nginx + module + esid, esi_plan off)"
            % port)

        # The same with parse plans: cache hits replay the page's plan.
        http = target_http("esiplan", "/esi/",
                           "            esi on;\n            esi_stitch off;",
                           "    esi_daemon unix:%s;\n"
                           "    esi_cookies user theme;" % sock,
                           "$esi_status")
        proc, port = self.nginx("esiplan", http, "load_module %s;" % module)
        self.targets["esiplan"] = Target("esiplan", port, [proc, esid])
        log("esiplan  on 127.0.0.1:%d (nginx + module + esid, plans)" % port)

        # The README's minimal configuration: plans and gzip stitching by
        # default, cached runs going out as the segments esid deflated once,
        # fragments deflated live.  (The arms share esid's default plan
        # zone; each has a cache of its own, so no arm's plan identifies
        # another's object.)
        http = target_http("minimal", "/esi/", "            esi on;",
                           "    esi_daemon unix:%s;\n"
                           "    esi_cookies user theme;" % sock,
                           "$esi_status")
        proc, port = self.nginx("minimal", http, "load_module %s;" % module)
        self.targets["minimal"] = Target("minimal", port, [proc, esid])
        log("minimal  on 127.0.0.1:%d (nginx + module + esid, esi on alone: "
            "plans, stitch)" % port)

        # NGINX with ESI off (module loaded, `esi off`): the same bytes,
        # already assembled.
        http = target_http("noesi", "/flat/", "            esi off;",
                           "    esi_daemon unix:%s;" % sock, "$esi_status")
        proc, port = self.nginx("noesi", http, "load_module %s;" % module)
        self.targets["noesi"] = Target("noesi", port, [proc])
        log("noesi    on 127.0.0.1:%d (nginx, esi off)" % port)

        # The assembled page, gzipped ahead of time: what one NGINX can
        # send of the page when nothing is assembled or compressed per
        # request (half of a 1-fragment row's composed ceiling).
        http = fill(ORIGIN_HTTP, {
            "DIR": os.path.join(self.tmp, "origin"),
            "LOCATIONS":
                "        location /static/ { gzip_static on; }"},
            strict=False)
        proc, port = self.nginx("static", http)
        self.targets["static"] = Target("static", port, [proc])
        log("static   on 127.0.0.1:%d (nginx, gzip_static)" % port)

        # NGINX SSI.
        http = target_http("ssi", "/ssi/", "            ssi on;", "", "-")
        proc, port = self.nginx("ssi", http)
        self.targets["ssi"] = Target("ssi", port, [proc])
        log("ssi      on 127.0.0.1:%d (nginx SSI)" % port)

        # Varnish.
        vdir = os.path.join(self.tmp, "varnish")
        os.makedirs(vdir, exist_ok=True)
        vcl = os.path.join(vdir, "bench.vcl")
        with open(vcl, "w") as f:
            f.write(fill(VCL, {"ORIGIN": self.origin_port}))
        try:
            proc, port = start_on_port(lambda port: self.spawn("varnish", [
                VARNISHD, "-F", "-j", "none", "-n", os.path.join(vdir, "n"),
                "-a", "127.0.0.1:%d" % port, "-T", "none",
                "-f", vcl, "-s", "malloc,1g"]))
        except DidNotStart as e:
            raise RuntimeError("varnishd did not start:\n" + e.log[-4000:])
        self.targets["varnish"] = Target("varnish", port, [proc])
        log("varnish  on 127.0.0.1:%d (%s)" % (port, self.varnish_version()))

    def esid_stats(self):
        """esid's counters (`esictl stats --json`)."""
        r = subprocess.run([os.path.join(self.args.build_dir, "esictl"),
                            "--socket", self.esid_socket, "stats", "--json"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError("esictl stats: " + r.stderr)
        return json.loads(r.stdout)

    def varnish_version(self):
        out = subprocess.run([VARNISHD, "-V"], capture_output=True,
                             text=True).stderr
        m = re.search(r"varnish-([0-9.]+)", out)
        return "varnish " + (m.group(1) if m else "?")

    # -- the arms ------------------------------------------------------

    def resolve_main(self, row, arm):
        """(target, path, expected bytes) of a main-matrix arm."""
        name = arm.replace("-aa", "")
        if name == "origin":
            return (self.targets[name], self.urls[("main", row, name)],
                    fragment_body("/f%d/0" % row[1]))
        return (self.targets[name], self.urls[("main", row, name)],
                self.expected[("main", row)])

    def resolve_cost(self, row, arm):
        if arm == "esi-off":
            return (self.targets["noesi"], self.urls[("cost", row)],
                    self.expected[("cost", row, "off")])
        if arm == "ssi-filter":
            return (self.targets["ssi"], self.urls[("cost", row, "ssi")],
                    self.expected[("cost", row, "ssi")])
        return (self.targets["esiplan" if arm == "esi-plan" else "esi"],
                self.urls[("cost", row)],
                self.expected[("cost", row, "on")])

    def resolve_lang(self, row, arm):
        _, size, plans = row
        return (self.targets["esiplan" if plans == "on" else "esi"],
                self.urls[("lang", size, arm.replace("-aa", ""))],
                self.expected[("lang", size)])

    # -- checking ------------------------------------------------------

    def fetch(self, url, accept_gzip, request_headers=()):
        """(status, headers, decoded body or None, note) via curl."""
        hdr = os.path.join(self.tmp, "curl.headers")
        body = os.path.join(self.tmp, "curl.body")
        argv = ["curl", "-sS", "--max-time", "15", "-D", hdr, "-o", body]
        if accept_gzip:
            argv += ["-H", "Accept-Encoding: gzip"]
        for h in request_headers:
            argv += ["-H", h]
        r = subprocess.run(argv + [url], capture_output=True, text=True)
        if r.returncode != 0:
            return None, {}, None, "curl failed: " + r.stderr.strip()
        with open(hdr, "rb") as f:
            lines = f.read().decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        with open(body, "rb") as f:
            data = f.read()
        note = ""
        if headers.get("content-encoding") == "gzip":
            try:
                data = gzip.decompress(data)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                return status, headers, None, "bad gzip: %s" % e
        elif accept_gzip:
            note = "not gzip-encoded"
        return status, headers, data, note

    def verify(self, target, path, expected, accept_gzip, headers=()):
        """None if the target answers `expected` three times (a miss, a
        hit, and a hit again: the first that a parse plan replays), else
        what differs."""
        for attempt in ("first", "second", "third"):
            status, _, data, note = self.fetch(target.url(path),
                                               accept_gzip, headers)
            if data is None:
                return "%s fetch: %s" % (attempt, note)
            if status != 200:
                return "%s fetch: status %s" % (attempt, status)
            if note:
                return "%s fetch: %s" % (attempt, note)
            if data != expected:
                at = next((i for i, (x, y) in enumerate(zip(data, expected))
                           if x != y), min(len(data), len(expected)))
                return ("%s fetch: %d bytes where %d were expected, first "
                        "difference at byte %d: got %r, expected %r" % (
                            attempt, len(data), len(expected), at,
                            data[max(0, at - 20):at + 40],
                            expected[max(0, at - 20):at + 40]))
        return None

    # -- timing --------------------------------------------------------

    def wrk(self, target, path, accept_gzip, duration, headers=()):
        """One wrk run: dict of rps, p50, p99 (ms), requests, errors, cpu."""
        argv = ["wrk", "-t%d" % self.args.threads,
                "-c%d" % self.args.connections, "-d%ds" % duration,
                "--timeout", "10s", "--latency"]
        if accept_gzip:
            argv += ["-H", "Accept-Encoding: gzip"]
        for h in headers:
            argv += ["-H", h]
        argv.append(target.url(path))
        pids = target.pids()
        esid = [p.pid for p in target.procs if p.name == "esid"]
        alog = os.path.join(self.tmp, target.name, "access.log")
        log_at = os.path.getsize(alog) if os.path.exists(alog) else 0
        cpu0, esid0 = cpu_seconds(pids), cpu_seconds(esid)
        r = subprocess.run(argv, capture_output=True, text=True,
                           timeout=duration + 60)
        cpu1, esid1 = cpu_seconds(pids), cpu_seconds(esid)
        out = r.stdout
        if r.returncode != 0 or "Requests/sec" not in out:
            raise RuntimeError("wrk failed on %s: %s %s" % (
                target.name, out, r.stderr))
        res = {
            "rps": float(re.search(r"Requests/sec:\s+([0-9.]+)", out)
                         .group(1)),
            "requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "p50": latency_ms(out, "50%"),
            "p99": latency_ms(out, "99%"),
            "errors": 0,
        }
        m = re.search(r"Socket errors: connect (\d+), read (\d+), "
                      r"write (\d+), timeout (\d+)", out)
        if m:
            res["errors"] += sum(int(x) for x in m.groups())
        m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        if m:
            res["errors"] += int(m.group(1))
        res["cpu_us"] = ((cpu1 - cpu0) * 1e6 / res["requests"]
                         if res["requests"] else float("nan"))
        # esid's own part of it (esid is single-process, no children).
        res["cpu_us_esid"] = ((esid1 - esid0) * 1e6 / res["requests"]
                              if esid and res["requests"] else float("nan"))
        # From the target's own access log: pages the module answered 200
        # but did not process (`$esi_status` passthrough or aborted: the
        # fallback was used).  Non-2xx answers are counted by wrk; 499s
        # are wrk closing its connections at the end of the run.
        res["unprocessed"] = 0
        if os.path.exists(alog):
            with open(alog, "rb") as f:
                f.seek(log_at)
                for line in f.read().decode("latin-1").splitlines():
                    status, _, esi = line.partition(" ")
                    if status == "200" and esi not in ("processed", "-", ""):
                        res["unprocessed"] += 1
        return res


def latency_ms(out, pct):
    m = re.search(r"^\s+%s\s+([0-9.]+)(us|ms|s)\s*$" % re.escape(pct), out,
                  re.M)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


# -- the matrices ------------------------------------------------------------------

def summarize(runs):
    return {
        "rps": median([r["rps"] for r in runs]),
        "p50": median([r["p50"] for r in runs]),
        "p99": median([r["p99"] for r in runs]),
        "cpu_us": median([r["cpu_us"] for r in runs]),
        "cpu_us_esid": median([r["cpu_us_esid"] for r in runs]),
        "requests": sum(r["requests"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "unprocessed": sum(r["unprocessed"] for r in runs),
        "rps_runs": [r["rps"] for r in runs],
    }


def measure_rows(bench, rows, arms, resolve, accept_gzip, runs, duration,
                 headers=()):
    """For each row, `runs` rounds over `arms`, each round measuring every
    arm once (interleaved, so slow drift on a shared machine hits all
    arms alike).  resolve(row, arm) -> (target, path, expected); headers
    go with every request."""
    results = {}
    for row in rows:
        verified = {}
        for arm in arms:
            target, path, expected = resolve(row, arm)
            if arm.endswith("-aa"):
                verified[arm] = verified[arm[:-3]]
                continue
            problem = bench.verify(target, path, expected,
                                   accepts_gzip(arm, accept_gzip), headers)
            verified[arm] = problem
            if problem:
                log("%s %s: DIFFERS, not timed: %s" % (
                    row_label(row), ARM_LABEL[arm], problem))
                bench.problems.append((row, arm, problem))
        collected = {arm: [] for arm in arms}
        for rnd in range(runs):
            for arm in arms:
                if verified[arm]:
                    continue
                target, path, _ = resolve(row, arm)
                collected[arm].append(bench.wrk(
                    target, path, accepts_gzip(arm, accept_gzip), duration,
                    headers))
        row_results = {}
        for arm in arms:
            if verified[arm]:
                row_results[arm] = {"differs": verified[arm]}
            else:
                row_results[arm] = summarize(collected[arm])
        results[row] = row_results
        print_row(row, arms, row_results)
    return results


def accepts_gzip(arm, gzip_client):
    """The origin arm asks for a fragment as the ESI servers do: plain."""
    return gzip_client and arm != "origin"


def smoke(bench, rows, cost_rows, lang_rows, t0):
    """Every matrix's rows, every arm but its A/A one: each answer checked,
    nothing timed; then esid's counters say the plan arms replayed plans
    and the stitch arm stitched.  Returns whether all was right."""
    failed = passed = 0
    for matrix_rows, arms, resolve, gzip_client, headers in (
            (rows, MAIN_ARMS, bench.resolve_main, True, ()),
            (cost_rows, COST_ARMS, bench.resolve_cost, False, ()),
            (lang_rows, LANG_ARMS, bench.resolve_lang, False, LANG_HEADERS)):
        for row in matrix_rows:
            for arm in arms[:-1]:
                t, path, exp = resolve(row, arm)
                problem = bench.verify(t, path, exp,
                                       accepts_gzip(arm, gzip_client),
                                       headers)
                log("%-22s %-16s %s" % (row_label(row), ARM_LABEL[arm],
                                        problem or "ok"))
                failed += bool(problem)
                passed += not problem
    # Each plan arm's third fetch was a planned hit.
    planned = bench.esid_stats()["planned"]
    expected = 2 * len(rows) + len(cost_rows) + sum(
        len(LANG_ARMS) - 1 for row in lang_rows if row[2] == "on")
    log("planned hits: %d" % planned)
    if planned < expected:
        log("the plan arms replayed %d plans, expected at least %d" % (
            planned, expected))
        failed += 1
    # ... and the stitch arm's named its segments.
    stitched = bench.esid_stats()["stitched"]
    log("stitched hits: %d" % stitched)
    if stitched < len(rows):
        log("the stitch arm sent %d plans with segments, expected at "
            "least %d" % (stitched, len(rows)))
        failed += 1
    for name, t in bench.targets.items():
        if not t.alive():
            log("%s died" % name)
            failed += 1
    log("smoke: %d answers checked, %d wrong (%d s)" % (
        passed + failed, failed, time.monotonic() - t0))
    return failed == 0


# -- the machine -------------------------------------------------------------------

def machine_info(args):
    def first(cmd, pattern=None):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
            out = (r.stdout + r.stderr).strip()
        except OSError:
            return "?"
        if pattern:
            m = re.search(pattern, out)
            return m.group(1) if m else "?"
        return out.splitlines()[0] if out else "?"

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // (1024 * 1024)
    # What recompressing the shell costs here: the floor under every NGINX
    # arm at a gzip client, and what Varnish's stored gzip avoids.
    import zlib
    shell = main_pages(1, 0)[2]
    t = time.process_time()
    for _ in range(20):
        zlib.compress(shell, 6)
    deflate_ms = (time.process_time() - t) / 20 * 1000
    return {
        "deflate_ms": deflate_ms,
        "deflate_ratio": len(shell) / len(zlib.compress(shell, 6)),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": "%d GiB" % mem,
        "kernel": os.uname().release,
        "nginx": first([NGINX, "-v"], r"nginx/(\S+)"),
        "varnish": first([VARNISHD, "-V"], r"varnish-([0-9.]+)"),
        "wrk": first(["wrk", "-v"], r"wrk (\S+)"),
        "product": args.product,
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def exit_on_signals():
    """SIGTERM, SIGINT and SIGHUP end the run as an exception would, so that
    every `finally` stops what it started."""
    def shutdown(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, shutdown)
