#!/usr/bin/env python3
"""The benchmark driver behind bench/run.sh (which installs and builds first).

Starts, each on its own 127.0.0.1 port with its own temporary prefix:

  origin   Debian nginx + the echo module: the page shells as static files,
           the fragments as `echo` locations behind `echo_sleep` D ms
  esi      Debian nginx + ngx_http_esi_module + esid (this project)
  varnish  Debian's Varnish 7.1, do_esi + do_gzip on the shell, fragments
           passed (uncached)
  ssi      Debian nginx with its own SSI on <!--# include virtual --> pages
  noesi    Debian nginx + the module loaded but `esi off`, serving the
           already-assembled page (same bytes, no assembly)

Every target's answer is checked byte for byte (after gunzip) against the
page computed here before it is timed; a target that differs is reported
and not timed.  Each figure is the median of several interleaved wrk runs;
the `esi` target is measured twice per row (the A/A arm).

Everything started here is stopped on the way out, also on failure.
"""

import argparse
import csv
import datetime
import gzip
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NGINX = os.environ.get("ESI_NGINX", "/usr/sbin/nginx")
VARNISHD = os.environ.get("ESI_VARNISHD", "/usr/sbin/varnishd")
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"

KB = 1024
SHELL_SIZE = 256 * KB
DELAYS = (0, 20, 50)            # ms per fragment at the origin
FRAGMENTS = (1, 8, 32)
COST_SIZES = (16 * KB, 256 * KB, 4096 * KB)
COST_INCLUDES = (0, 16)
COST_KINDS = ("dense", "text")  # one '<' per 11 bytes, per 71 bytes

START_BOUND = 30.0
STOP_BOUND = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Main-matrix arms in the order each round measures them.  "minimal" is the
# README's minimal configuration, `esi on` alone: plans and gzip stitching
# by default.  "esi" parses every hit (`esi_plan off`); "esi-aa" is the same
# target measured again in the same round: the A/A arm.  "esiplan" replays
# plans without stitching (`esi_stitch off`).
# "origin" is one fragment fetched from the origin itself, with the same
# wrk: the ceiling of a 1-fragment row, which no ESI server can pass.
MAIN_ARMS = ("esi", "esiplan", "minimal", "varnish", "ssi", "noesi",
             "origin", "esi-aa")
COST_ARMS = ("esi-off", "esi-on", "esi-plan", "esi-on-aa")
ARM_LABEL = {
    "esi": "esi_plan off",
    "esiplan": "plans, esi_stitch off",
    "minimal": "esi on (minimal configuration)",
    "esi-plan": "esi on, plans",
    "esi-aa": "esi_plan off (A/A)",
    "varnish": "Varnish 7.1",
    "ssi": "nginx SSI",
    "noesi": "nginx, no ESI",
    "origin": "one fragment from the origin",
    "esi-off": "esi off",
    "esi-on": "esi on, esi_plan off",
    "esi-on-aa": "esi on, esi_plan off (A/A)",
    "without": "without",
    "with": "with vars, choose",
    "with-aa": "with (A/A)",
}


def log(msg):
    sys.stdout.write("bench: %s\n" % msg)
    sys.stdout.flush()


# -- pages ---------------------------------------------------------------------

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do "
         "eiusmod tempor incididunt ut labore et dolore magna aliqua enim "
         "minim veniam quis nostrud exercitation ullamco laboris nisi aliquip "
         "commodo consequat duis aute irure reprehenderit voluptate velit "
         "esse cillum fugiat nulla pariatur excepteur sint occaecat cupidatat "
         "proident sunt culpa officia deserunt mollit anim laborum").split()


def fragment_body(uri):
    """What the origin's echo location answers for a fragment URI."""
    return ('<div class="frag">%s</div>\n' % uri).encode()


COST_FRAGMENT = b'<span class="frag">fragment</span>\n'

# The ESI-language matrix (issue #9): a page with 16 variable references
# and 4 choose blocks against the same page with their outcome written in,
# both through esi on, for one client whose request the page reads.  The
# page without them starts with one <esi:comment>, so that it is a planned
# page too: a page with no ESI at all goes out as with esi off once a worker
# has its one-run plan, and the ratio would then be that of esid's round
# trip, not of evaluating the variables and tests.
LANG_BASELINE_MARK = b'<esi:comment text="a planned page"/>'
LANG_SIZES = (16 * KB, 256 * KB)
LANG_ARMS = ("without", "with", "with-aa")
LANG_QUERY = "?q=shoes&page=2"
LANG_HEADERS = (
    "Host: shop.example",
    "Cookie: user=alice; theme=dark; session=secret",
    "Accept-Language: en-GB,en;q=0.8,fr;q=0.5",
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 "
    "Firefox/120.0",
)
# (markup, what it yields for LANG_HEADERS and LANG_QUERY)
LANG_VARS = (
    ("$(HTTP_COOKIE{user})", "alice"),
    ("$(HTTP_COOKIE{theme})", "dark"),
    ("$(HTTP_COOKIE{session}|anonymous)", "anonymous"),  # not esi_cookies'
    ("$(QUERY_STRING{q})", "shoes"),
    ("$(QUERY_STRING{page})", "2"),
    ("$(QUERY_STRING{sort}|price)", "price"),
    ("$(HTTP_ACCEPT_LANGUAGE{en})", "true"),
    ("$(HTTP_ACCEPT_LANGUAGE{de})", "false"),
    ("$(HTTP_USER_AGENT{browser})", "MOZILLA"),
    ("$(HTTP_USER_AGENT{os})", "UNIX"),
    ("$(HTTP_USER_AGENT{version})", "5.0"),
    ("$(HTTP_HOST)", "shop.example"),
    ("$(HTTP_REFERER|direct)", "direct"),
    ("$(HTTP_COOKIE{user})", "alice"),
    ("$(QUERY_STRING{q})", "shoes"),
    ("$(HTTP_COOKIE{missing}|none)", "none"),
)
LANG_CHOOSES = (
    ("<esi:choose><esi:when test=\"$(HTTP_COOKIE{theme}) == 'dark'\">"
     "<p>dark theme</p></esi:when><esi:otherwise><p>light theme</p>"
     "</esi:otherwise></esi:choose>", "<p>dark theme</p>"),
    ("<esi:choose><esi:when test=\"$(QUERY_STRING{page}) > 1\">"
     "<a>previous page</a></esi:when><esi:otherwise></esi:otherwise>"
     "</esi:choose>", "<a>previous page</a>"),
    ("<esi:choose><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{de})\">"
     "<p>Hallo</p></esi:when><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{en})\">"
     "<p>Hello</p></esi:when><esi:otherwise><p>Hi</p></esi:otherwise>"
     "</esi:choose>", "<p>Hello</p>"),
    ("<esi:choose><esi:when test=\"$(HTTP_USER_AGENT{browser}) == 'MSIE'\">"
     "<p>old browser</p></esi:when><esi:otherwise><p>modern browser</p>"
     "</esi:otherwise></esi:choose>", "<p>modern browser</p>"),
)


def esi_tag(uri):
    return ('<esi:include src="%s"/>' % uri).encode()


def ssi_tag(uri):
    return ('<!--# include virtual="%s" -->' % uri).encode()


def shell_filler(size, rng):
    """`size` bytes of product-listing HTML, in whole lines but the last."""
    out = []
    n = 0
    i = 0
    while n < size:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        line = ('<li class="item"><a href="/p/%d">%s</a> <span class="price">'
                '%d.%02d</span></li>\n' % (
                    i, words, rng.randint(1, 999), rng.randint(0, 99)))
        out.append(line.encode())
        n += len(line)
        i += 1
    return b"".join(out)[:size]


def cost_filler(size, kind, rng):
    """`size` bytes with one '<' every 11 (dense) or 71 (text) bytes."""
    gap = 11 if kind == "dense" else 71
    out = []
    n = 0
    closing = False
    while n < size:
        tag = b"</b>" if closing else b"<b>"
        closing = not closing
        text = []
        room = gap - len(tag)
        while room > 0:
            w = rng.choice(WORDS)
            text.append((w + " ")[:room])
            room -= len(text[-1])
        unit = tag + "".join(text).encode()
        out.append(unit)
        n += len(unit)
    return b"".join(out)[:size]


def split_at_lines(data, parts):
    """`data` cut into `parts` pieces of about equal size, at newlines."""
    cuts = [0]
    for k in range(1, parts):
        at = data.find(b"\n", len(data) * k // parts)
        at = len(data) if at < 0 else at + 1
        cuts.append(max(at, cuts[-1]))
    cuts.append(len(data))
    return [data[cuts[k]:cuts[k + 1]] for k in range(parts)]


def split_even(data, parts, boundary=b"<"):
    """`data` cut into `parts` pieces of about equal size, before a '<'."""
    cuts = [0]
    for k in range(1, parts):
        at = data.find(boundary, len(data) * k // parts)
        at = len(data) if at < 0 else at
        cuts.append(max(at, cuts[-1]))
    cuts.append(len(data))
    return [data[cuts[k]:cuts[k + 1]] for k in range(parts)]


HEAD = (b'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        b'<title>bench</title></head>\n<body><ul class="listing">\n')
TAIL = b"</ul></body></html>\n"


def main_pages(n, d):
    """(ESI shell, SSI shell, assembled page) for N fragments, D ms."""
    uris = ["/f%d/%d" % (d, i) for i in range(n)]
    tags = sum(len(esi_tag(u)) for u in uris)
    rng = random.Random(1000 * n + d)
    filler = shell_filler(SHELL_SIZE - len(HEAD) - len(TAIL) - tags, rng)
    pieces = split_at_lines(filler, n + 1)

    def join(make):
        out = [HEAD, pieces[0]]
        for uri, piece in zip(uris, pieces[1:]):
            out += [make(uri), piece]
        out.append(TAIL)
        return b"".join(out)

    return join(esi_tag), join(ssi_tag), join(fragment_body)


def cost_pages(size, kind, includes):
    """(ESI page, assembled page) for the cost matrix."""
    uris = ["/cf/%d" % i for i in range(includes)]
    tags = sum(len(esi_tag(u)) for u in uris)
    rng = random.Random(size + includes + (7 if kind == "dense" else 0))
    filler = cost_filler(size - tags, kind, rng)
    pieces = split_even(filler, includes + 1)
    page = [pieces[0]]
    assembled = [pieces[0]]
    for uri, piece in zip(uris, pieces[1:]):
        page += [esi_tag(uri), piece]
        assembled += [COST_FRAGMENT, piece]
    return b"".join(page), b"".join(assembled)


def lang_pages(size):
    """(page with the variables and choose blocks, the same page with
    their outcome written in) for the language matrix."""
    rng = random.Random(size + 9)
    pieces = split_even(cost_filler(size, "text", rng), 8)
    marked, plain = [], []
    for i, piece in enumerate(pieces):
        marked.append(piece)
        plain.append(piece)
        if i % 2 == 0 and i // 2 < len(LANG_CHOOSES):
            markup, outcome = LANG_CHOOSES[i // 2]
            marked.append(markup.encode())
            plain.append(outcome.encode())
        elif i % 2 == 1:
            refs = LANG_VARS[(i // 2) * 4:(i // 2) * 4 + 4]
            marked.append(("<esi:vars><ul>%s</ul></esi:vars>" % "".join(
                "<li>%s</li>" % m for m, _ in refs)).encode())
            plain.append(("<ul>%s</ul>" % "".join(
                "<li>%s</li>" % v for _, v in refs)).encode())
    return b"".join(marked), b"".join(plain)


def size_label(size):
    return "%d MB" % (size // (1024 * KB)) if size >= 1024 * KB else \
        "%d KB" % (size // KB)


# -- processes -------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
            return True
        except OSError:
            return False


def unix_socket_answers(path):
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def poll(condition, bound=START_BOUND, interval=0.05):
    deadline = time.monotonic() + bound
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


class Process:
    """A child in a session of its own, stopped with its whole group."""

    def __init__(self, name, argv, logdir):
        self.name = name
        self.stderr_path = os.path.join(logdir, name + ".stderr")
        with open(os.path.join(logdir, name + ".stdout"), "ab") as out, \
                open(self.stderr_path, "ab") as err:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True)
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def _group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self):
        if self.alive():
            self._group(signal.SIGTERM)
            try:
                self.popen.wait(STOP_BOUND)
            except subprocess.TimeoutExpired:
                self._group(signal.SIGKILL)
                self.popen.wait(STOP_BOUND)
        # Whatever of its group outlived it (a varnish child, a worker).
        self._group(signal.SIGKILL)

    def stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""


def descendants(roots):
    """Pids of `roots` and all their descendants, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


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
@@FRAGMENT_LOCATIONS@@
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


def fill(template, values, strict=True):
    for key, value in values.items():
        template = template.replace("@@%s@@" % key, str(value))
    leftover = re.search(r"@@[A-Z_]+@@", template)
    assert not strict or leftover is None, leftover.group(0)
    return template


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


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="esi-bench-")
        self.procs = []
        self.targets = {}
        self.problems = []

    # -- starting things -----------------------------------------------

    def spawn(self, name, argv):
        proc = Process(name, argv, self.tmp)
        self.procs.append(proc)
        return proc

    def nginx_conf(self, name, http, modules, port, log_level="warn"):
        """Writes tmp/name/nginx.conf (also for a reload); returns its
        path."""
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        conf = fill(NGINX_MAIN, {
            "USER": "user root;" if os.geteuid() == 0 else "",
            "WORKERS": self.args.workers,
            "DIR": d,
            "LOG_LEVEL": log_level,
            "MODULES": modules,
            "HTTP": http.replace("@@PORT@@", str(port)),
        })
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        return path

    def nginx(self, name, http, modules="", log_level="warn"):
        """An nginx of its own in tmp/name; returns (process, port)."""
        d = os.path.join(self.tmp, name)
        for attempt in range(3):
            port = free_port()
            path = self.nginx_conf(name, http, modules, port, log_level)
            proc = self.spawn(name, [NGINX, "-p", d + "/", "-e",
                                     d + "/error.log", "-c", path,
                                     "-g", "daemon off;"])
            if poll(lambda: not proc.alive() or port_answers(port)) and \
                    proc.alive():
                return proc, port
            proc.stop()
            errors = open(os.path.join(d, "error.log")).read()
            if "Address already in use" in errors and attempt < 2:
                continue
            raise RuntimeError("%s did not start:\n%s" % (name, errors[-3000:]))

    def write_pages(self):
        www = os.path.join(self.tmp, "origin", "www")
        self.expected = {}   # (matrix, row) -> expected bytes
        self.urls = {}       # (matrix, row, target) -> path
        for n in FRAGMENTS:
            for d in DELAYS:
                esi, ssi, flat = main_pages(n, d)
                name = "n%d-d%d.html" % (n, d)
                for sub, data in (("esi", esi), ("ssi", ssi), ("flat", flat)):
                    os.makedirs(os.path.join(www, sub), exist_ok=True)
                    with open(os.path.join(www, sub, name), "wb") as f:
                        f.write(data)
                row = (n, d)
                self.expected[("main", row)] = flat
                self.urls[("main", row, "esi")] = "/esi/" + name
                self.urls[("main", row, "esiplan")] = "/esi/" + name
                self.urls[("main", row, "minimal")] = "/esi/" + name
                self.urls[("main", row, "varnish")] = "/esi/" + name
                self.urls[("main", row, "ssi")] = "/ssi/" + name
                self.urls[("main", row, "noesi")] = "/flat/" + name
                self.urls[("main", row, "origin")] = "/f%d/0" % d
        os.makedirs(os.path.join(www, "cost"), exist_ok=True)
        for size in COST_SIZES:
            for kind in COST_KINDS:
                for inc in COST_INCLUDES:
                    page, assembled = cost_pages(size, kind, inc)
                    name = "%d-%s-%d.html" % (size // KB, kind, inc)
                    with open(os.path.join(www, "cost", name), "wb") as f:
                        f.write(page)
                    row = (size, kind, inc)
                    self.expected[("cost", row, "on")] = assembled
                    self.expected[("cost", row, "off")] = page
                    self.urls[("cost", row)] = "/cost/" + name
        os.makedirs(os.path.join(www, "lang"), exist_ok=True)
        for size in LANG_SIZES:
            marked, plain = lang_pages(size)
            for arm, data in (("with", marked),
                              ("without", LANG_BASELINE_MARK + plain)):
                name = "%d-%s.html" % (size // KB, arm)
                with open(os.path.join(www, "lang", name), "wb") as f:
                    f.write(data)
                self.urls[("lang", size, arm)] = "/lang/" + name + LANG_QUERY
            self.expected[("lang", size)] = plain

    def start(self):
        self.write_pages()
        a = self.args

        # The origin.
        frags = []
        for d in DELAYS:
            sleep = "echo_sleep %.3f; " % (d / 1000.0) if d else ""
            frags.append("        location /f%d/ { %secho "
                         "'<div class=\"frag\">$uri</div>'; }" % (d, sleep))
        http = fill(ORIGIN_HTTP, {
            "DIR": os.path.join(self.tmp, "origin"),
            "FRAGMENT_LOCATIONS": "\n".join(frags)}, strict=False)
        proc, self.origin_port = self.nginx(
            "origin", http, "load_module %s;" % ECHO_MODULE)
        self.targets["origin"] = Target("origin", self.origin_port, [proc])
        log("origin   on 127.0.0.1:%d" % self.origin_port)

        module = os.path.join(a.build_dir, "ngx_http_esi_module.so")
        esid_bin = os.path.join(a.build_dir, "esid")
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
        esid = self.spawn("esid", [esid_bin, "--socket", sock,
                                   "--log-level", "warn"])
        if not poll(lambda: not esid.alive() or unix_socket_answers(sock)) \
                or not esid.alive():
            raise RuntimeError("esid did not start:\n" + esid.stderr())
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
        for attempt in range(3):
            port = free_port()
            proc = self.spawn("varnish", [
                VARNISHD, "-F", "-j", "none", "-n", os.path.join(vdir, "n"),
                "-a", "127.0.0.1:%d" % port, "-T", "none",
                "-f", vcl, "-s", "malloc,1g"])
            if poll(lambda: not proc.alive() or port_answers(port)) and \
                    proc.alive():
                break
            proc.stop()
            if attempt == 2:
                raise RuntimeError("varnishd did not start:\n" +
                                   proc.stderr())
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


def row_label(row):
    if row[0] == "lang":
        return "%s plans %s" % (size_label(row[1]), row[2])
    if len(row) == 2:
        return "N=%d D=%dms" % row
    return "%s %s %d includes" % (size_label(row[0]), row[1], row[2])


def fmt(v, digits=0):
    if v != v:
        return "n/a"
    if digits == 0:
        return "{:,.0f}".format(v) if v >= 100 else "{:,.1f}".format(v)
    return "{:,.{d}f}".format(v, d=digits)


def fmt_ms(v):
    if v != v:
        return "n/a"
    return "%.0f" % v if v >= 100 else ("%.1f" % v if v >= 10 else "%.2f" % v)


def print_row(row, arms, res):
    parts = []
    for arm in arms:
        r = res[arm]
        if "differs" in r:
            parts.append("%s DIFFERS" % ARM_LABEL[arm])
        else:
            parts.append("%s %s rps (p50 %s ms, p99 %s ms, %s us cpu/req)" % (
                ARM_LABEL[arm], fmt(r["rps"]), fmt_ms(r["p50"]),
                fmt_ms(r["p99"]), fmt(r["cpu_us"])))
    log("%s: %s" % (row_label(row), "; ".join(parts)))


def ratio(a, b):
    try:
        return a["rps"] / b["rps"]
    except (KeyError, ZeroDivisionError, TypeError):
        return float("nan")


def fmt_ratio(x):
    if x != x:
        return "n/a"
    return "%.2fx" % x


def pct(x):
    if x != x:
        return "n/a"
    return "%+.1f%%" % ((x - 1) * 100)


def verdict(ours, theirs, aa):
    """Who wins a row, given the A/A drift as the noise floor."""
    r = ratio(ours, theirs)
    if r != r:
        return "n/a"
    noise = max(abs(aa - 1) if aa == aa else 0, 0.05)
    if abs(r - 1) <= noise:
        return "tie (within A/A noise)"
    return "**ours**" if r > 1 else "**Varnish**"


# -- results -----------------------------------------------------------------------

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


def write_results(args, info, main_res, cost_res, lang_res, started,
                  load_before, load_after, elapsed):
    os.makedirs(args.results, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d")
    base = os.path.join(args.results, "%s-%s" % (stamp, args.mode))

    # CSV: one line per (matrix, row, arm).
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["matrix", "fragments", "delay_ms", "page_bytes", "kind",
                    "includes", "arm", "target", "verified", "rps", "p50_ms",
                    "p99_ms", "cpu_us_per_req", "esid_cpu_us_per_req", "requests", "errors",
                    "unprocessed", "rps_runs"])
        for row, arms in main_res.items():
            for arm, r in arms.items():
                w.writerow(["fragments", row[0], row[1], SHELL_SIZE, "shell",
                            ""]
                           + csv_arm(arm, r))
        for row, arms in cost_res.items():
            for arm, r in arms.items():
                w.writerow(["cost", "", "", row[0], row[1], row[2]]
                           + csv_arm(arm, r))
        for row, arms in lang_res.items():
            for arm, r in arms.items():
                w.writerow(["language", "", "", row[1], "plans " + row[2],
                            ""] + csv_arm(arm, r))

    md = markdown(args, info, main_res, cost_res, lang_res, started,
                  load_before, load_after, elapsed)
    with open(base + ".md", "w") as f:
        f.write(md)
    plots = plot(args, base, main_res, cost_res)
    return base, md, plots


TARGET_OF_ARM = {"esi": "esi", "esi-aa": "esi", "esiplan": "esiplan",
                 "minimal": "minimal",
                 "varnish": "varnish", "ssi": "ssi", "noesi": "noesi",
                 "origin": "origin", "esi-off": "noesi", "esi-on": "esi", "esi-plan": "esiplan",
                 "esi-on-aa": "esi", "without": "esi", "with": "esi",
                 "with-aa": "esi"}


def csv_arm(arm, r):
    target = TARGET_OF_ARM[arm]
    if "differs" in r:
        return [arm, target, "differs: " + r["differs"]] + [""] * 9
    return [arm, target, "yes", "%.1f" % r["rps"], "%.3f" % r["p50"],
            "%.3f" % r["p99"], "%.1f" % r["cpu_us"],
            "" if r["cpu_us_esid"] != r["cpu_us_esid"] else
            "%.1f" % r["cpu_us_esid"], r["requests"],
            r["errors"], r["unprocessed"],
            " ".join("%.1f" % x for x in r["rps_runs"])]


def cell(r, key, f):
    if "differs" in r:
        return "differs"
    return f(r[key])


def markdown(args, info, main_res, cost_res, lang_res, started, load_before,
             load_after, elapsed):
    L = []
    L.append("## %s run, %s" % (args.mode, started.strftime("%Y-%m-%d %H:%M")))
    L.append("")
    L.append("Machine: %d cores, %s, %s, Linux %s; nginx %s, Varnish %s, "
             "wrk %s. Measured: %s. Load average %s before, %s after; run "
             "took %d s. wrk -t%d -c%d, %d s per run, median of %d "
             "interleaved runs." % (
                 info["nproc"], info["cpu"], info["memory"], info["kernel"],
                 info["nginx"], info["varnish"], info["wrk"], info["product"],
                 load_before, load_after, elapsed, args.threads,
                 args.connections, args.duration, args.runs))
    L.append("")
    L.append("Deflating the 256 KB shell once at level 6 (zlib, as NGINX's "
             "gzip filter does per request and Varnish once per object) costs "
             "%.1f ms of CPU on this machine; it compresses %.1f:1." % (
                 info["deflate_ms"], info["deflate_ratio"]))
    L.append("")
    if main_res:
        L.append("### 256 KB cached shell, N uncached fragments, D ms origin "
                 "delay, gzip-accepting client")
        L.append("")
        L.append("Requests per second (median), ratios against Varnish and "
                 "against our own A/A arm; the last three columns are one "
                 "fragment fetched from the origin with the same wrk, the "
                 "ceiling of a 1-fragment row:")
        L.append("")
        L.append("| N | D | esi_plan off | A/A | A/A drift | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | plan off / Varnish | "
                 "plans, no stitch / Varnish | minimal / Varnish | "
                 "nginx SSI | nginx, no ESI | plan off / no ESI | "
                 "faster (minimal) | one fragment from the origin | "
                 "minimal / it | Varnish / it |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                 "---:|---:|---:|---|---:|---:|---:|")
        for row, r in main_res.items():
            aa = ratio(r["esi"], r["esi-aa"])
            L.append("| %d | %d ms | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                         row[0], row[1],
                         cell(r["esi"], "rps", fmt),
                         cell(r["esi-aa"], "rps", fmt), pct(aa),
                         cell(r["esiplan"], "rps", fmt),
                         cell(r["minimal"], "rps", fmt),
                         cell(r["varnish"], "rps", fmt),
                         fmt_ratio(ratio(r["esi"], r["varnish"])),
                         fmt_ratio(ratio(r["esiplan"], r["varnish"])),
                         fmt_ratio(ratio(r["minimal"], r["varnish"])),
                         cell(r["ssi"], "rps", fmt),
                         cell(r["noesi"], "rps", fmt),
                         fmt_ratio(ratio(r["esi"], r["noesi"])),
                         verdict(r["minimal"], r["varnish"], aa),
                         cell(r["origin"], "rps", fmt),
                         fmt_ratio(ratio(r["minimal"], r["origin"])),
                         fmt_ratio(ratio(r["varnish"], r["origin"]))))
        L.append("")
        L.append("Latency, p50 / p99 in ms (median of the runs):")
        L.append("")
        L.append("| N | D | esi_plan off | A/A | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | nginx SSI | nginx, no ESI |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in main_res.items():
            L.append("| %d | %d ms | %s |" % (row[0], row[1], " | ".join(
                cell(r[a], "p50", fmt_ms) + " / " + cell(r[a], "p99", fmt_ms)
                if "differs" not in r[a] else "differs"
                for a in ("esi", "esi-aa", "esiplan", "minimal", "varnish",
                          "ssi", "noesi"))))
        L.append("")
        L.append("CPU per request in microseconds (utime + stime of the "
                 "target's processes; ours counts nginx and esid, esid's "
                 "part in its own column):")
        L.append("")
        L.append("| N | D | esi_plan off | of it esid | A/A | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | plan off / Varnish | "
                 "nginx SSI | nginx, no ESI |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in main_res.items():
            try:
                cr = r["esi"]["cpu_us"] / r["varnish"]["cpu_us"]
            except (KeyError, ZeroDivisionError):
                cr = float("nan")
            L.append("| %d | %d ms | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |"
                     % (row[0], row[1], cell(r["esi"], "cpu_us", fmt),
                cell(r["esi"], "cpu_us_esid", fmt),
                cell(r["esi-aa"], "cpu_us", fmt),
                cell(r["esiplan"], "cpu_us", fmt),
                cell(r["minimal"], "cpu_us", fmt),
                cell(r["varnish"], "cpu_us", fmt), fmt_ratio(cr),
                cell(r["ssi"], "cpu_us", fmt),
                cell(r["noesi"], "cpu_us", fmt)))
        L.append("")
    if cost_res:
        L.append("### What ESI costs: esi off vs esi on, cached page, "
                 "fragments answered by `return 200`, plain (no gzip) client")
        L.append("")
        L.append("| page | kind | includes | esi off rps | esi on rps | A/A "
                 "rps | A/A drift | on / off | plans rps | plans / off | "
                 "off p99 ms | on p99 ms | plans p99 ms | off CPU us/req | "
                 "on CPU us/req | of it esid | plans CPU us/req | of it esid |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                 "---:|---:|---:|---:|---:|---:|")
        for row, r in cost_res.items():
            aa = ratio(r["esi-on"], r["esi-on-aa"])
            L.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s | %s | %s | %s | %s | %s | %s |"
                     % (size_label(row[0]), row[1], row[2],
                        cell(r["esi-off"], "rps", fmt),
                        cell(r["esi-on"], "rps", fmt),
                        cell(r["esi-on-aa"], "rps", fmt), pct(aa),
                        fmt_ratio(ratio(r["esi-on"], r["esi-off"])),
                        cell(r["esi-plan"], "rps", fmt),
                        fmt_ratio(ratio(r["esi-plan"], r["esi-off"])),
                        cell(r["esi-off"], "p99", fmt_ms),
                        cell(r["esi-on"], "p99", fmt_ms),
                        cell(r["esi-plan"], "p99", fmt_ms),
                        cell(r["esi-off"], "cpu_us", fmt),
                        cell(r["esi-on"], "cpu_us", fmt),
                        cell(r["esi-on"], "cpu_us_esid", fmt),
                        cell(r["esi-plan"], "cpu_us", fmt),
                        cell(r["esi-plan"], "cpu_us_esid", fmt)))
        L.append("")
    if lang_res:
        L.append("### The ESI language: 16 variables and 4 choose blocks "
                 "against the same page with their outcome written in, "
                 "esi on, cached page, plain client")
        L.append("")
        L.append("| page | plans | without rps | with rps | A/A rps | A/A "
                 "drift | with / without | without p99 ms | with p99 ms | "
                 "without CPU us/req | with CPU us/req | of it esid |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in lang_res.items():
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |" % (
                         size_label(row[1]), row[2],
                         cell(r["without"], "rps", fmt),
                         cell(r["with"], "rps", fmt),
                         cell(r["with-aa"], "rps", fmt),
                         pct(ratio(r["with"], r["with-aa"])),
                         fmt_ratio(ratio(r["with"], r["without"])),
                         cell(r["without"], "p99", fmt_ms),
                         cell(r["with"], "p99", fmt_ms),
                         cell(r["without"], "cpu_us", fmt),
                         cell(r["with"], "cpu_us", fmt),
                         cell(r["with"], "cpu_us_esid", fmt)))
        L.append("")
    every = {}
    for res in (main_res, cost_res, lang_res):
        every.update(res)
    bad = [(row, arm) for row, arms in every.items()
           for arm, r in arms.items()
           if "differs" not in r and (r["errors"] or r["unprocessed"])]
    if bad:
        L.append("Runs with errors or unprocessed responses (wrk socket "
                 "errors/non-2xx, or `$esi_status` other than `processed`): " +
                 "; ".join("%s %s: %d errors, %d unprocessed" % (
                     row_label(row), ARM_LABEL[arm],
                     every[row][arm]["errors"],
                     every[row][arm]["unprocessed"])
                     for row, arm in bad) + ".")
        L.append("")
    differs = [(row, arm, r["differs"]) for row, arms in every.items()
               for arm, r in arms.items()
               if "differs" in r and not arm.endswith("-aa")]
    if differs:
        L.append("Targets whose output differed from the expected page (not "
                 "timed):")
        L.append("")
        for row, arm, why in differs:
            L.append("- %s, %s: %s" % (row_label(row), ARM_LABEL[arm],
                                        why[:300]))
        L.append("")
    return "\n".join(L)


def plot(args, base, main_res, cost_res):
    """PNG bar charts of rps and p99 per row, via gnuplot; returns paths."""
    if shutil.which("gnuplot") is None:
        log("gnuplot not found: no plots")
        return []
    made = []
    jobs = []
    if main_res:
        arms = ("esi", "esi-aa", "esiplan", "varnish", "ssi", "noesi")
        rows = [("N=%d D=%d" % row, r) for row, r in main_res.items()]
        jobs += [(base + "-rps.png", "requests/s (log scale)", "rps", arms,
                  rows, "256 KB shell, N fragments, D ms: requests/s"),
                 (base + "-p99.png", "p99 latency, ms (log scale)", "p99",
                  arms, rows, "256 KB shell, N fragments, D ms: p99 latency")]
    if cost_res:
        arms = ("esi-off", "esi-on", "esi-on-aa", "esi-plan")
        rows = [("%s %s %d" % (size_label(row[0]).replace(" ", ""), row[1],
                               row[2]), r) for row, r in cost_res.items()]
        jobs += [(base + "-cost-rps.png", "requests/s (log scale)", "rps",
                  arms, rows, "ESI cost: esi off, on, on with plans: requests/s"),
                 (base + "-cost-p99.png", "p99 latency, ms (log scale)",
                  "p99", arms, rows, "ESI cost: esi off, on, on with plans: p99 latency")]
    for png, ylabel, key, arms, rows, title in jobs:
        dat = png[:-4] + ".dat"
        with open(dat, "w") as f:
            f.write("row " + " ".join('"%s"' % ARM_LABEL[a] for a in arms)
                    + "\n")
            for label, r in rows:
                vals = []
                for a in arms:
                    v = r[a].get(key, float("nan")) if a in r else float("nan")
                    vals.append("NaN" if v != v else "%.3f" % v)
                f.write('"%s" %s\n' % (label, " ".join(vals)))
        script = """
set terminal pngcairo size 1100,520 noenhanced font ",10"
set output '%s'
set title '%s'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel '%s'
set key outside right top
set grid ytics
%s
plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)
""" % (png, title, ylabel,
       "set xtics rotate by -30" if len(rows) > 9 else "", len(arms) + 1, dat)
        r = subprocess.run(["gnuplot"], input=script, capture_output=True,
                           text=True)
        os.unlink(dat)
        if r.returncode != 0:
            script = script.replace("pngcairo", "png")
            r = subprocess.run(["gnuplot"], input=script, capture_output=True,
                               text=True)
        if r.returncode == 0:
            made.append(png)
        else:
            log("gnuplot failed: %s" % r.stderr.strip())
    return made


def update_readme(md, plots, marker="latest"):
    """Replace the section of bench/README.md between the `marker` comments
    (latest: the ESI matrix; purge.py has its own)."""
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- %s:begin -->" % marker, "<!-- %s:end -->" % marker
    if begin not in text or end not in text:
        return
    pics = "".join("![%s](results/%s)\n" % (
        os.path.basename(p), os.path.basename(p)) for p in plots)
    body = "%s\n%s\n%s%s" % (begin, md.replace("## ", "### Latest: ", 1)
                             .replace("\n### ", "\n#### "), pics, end)
    text = text[:text.index(begin)] + body + text[text.index(end) +
                                                  len(end):]
    with open(path, "w") as f:
        f.write(text)


# -- main ----------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("smoke", "short", "full"),
                   default="short")
    p.add_argument("--build-dir", required=True)
    p.add_argument("--product", default="?")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", default="2",
                   help="worker_processes of every nginx")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=int, help="seconds per wrk run")
    p.add_argument("--cost-duration", type=int)
    p.add_argument("--runs", type=int, help="runs per figure (median)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (configs, logs)")
    p.add_argument("--no-readme", action="store_true",
                   help="do not update bench/README.md")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)

    if args.mode == "full":
        rows = [(n, d) for n in FRAGMENTS for d in DELAYS]
        cost_rows = [(s, k, i) for s in COST_SIZES for k in COST_KINDS
                     for i in COST_INCLUDES]
        defaults = (4, 3, 2)
    else:
        rows = [(n, d) for n in (1, 32) for d in (0, 50)]
        cost_rows = []
        defaults = (2, 3, 2)
    if args.mode == "smoke":
        cost_rows = [(s, k, i) for s in COST_SIZES for k in COST_KINDS
                     for i in COST_INCLUDES]
    lang_rows = [("lang", s, plans) for s in LANG_SIZES
                 for plans in ("off", "on")]
    # Under 2 s a run can end before a 32 x 50 ms page (1.6 s at Varnish)
    # completes at all.
    if (args.duration or 2) < 2 or (args.cost_duration or 2) < 1:
        p.error("--duration must be at least 2 s, --cost-duration 1 s")
    args.duration = args.duration or defaults[0]
    args.runs = args.runs or defaults[1]
    args.cost_duration = args.cost_duration or defaults[2]

    def shutdown(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, shutdown)

    bench = Bench(args)
    started = datetime.datetime.now()
    t0 = time.monotonic()
    load_before = loadavg()
    ok = False
    try:
        bench.start()
        targets = bench.targets

        def resolve_main(row, arm):
            name = arm.replace("-aa", "")
            if name == "origin":
                return (targets[name], bench.urls[("main", row, name)],
                        fragment_body("/f%d/0" % row[1]))
            return (targets[name], bench.urls[("main", row, name)],
                    bench.expected[("main", row)])

        def resolve_cost(row, arm):
            if arm == "esi-off":
                return (targets["noesi"], bench.urls[("cost", row)],
                        bench.expected[("cost", row, "off")])
            return (targets["esiplan" if arm == "esi-plan" else "esi"],
                    bench.urls[("cost", row)],
                    bench.expected[("cost", row, "on")])

        def resolve_lang(row, arm):
            _, size, plans = row
            return (targets["esiplan" if plans == "on" else "esi"],
                    bench.urls[("lang", size, arm.replace("-aa", ""))],
                    bench.expected[("lang", size)])

        if args.mode == "smoke":
            failed = passed = 0
            # Every matrix's rows, every arm but its A/A one.
            for matrix_rows, arms, resolve, gzip_client, headers in (
                    (rows, MAIN_ARMS, resolve_main, True, ()),
                    (cost_rows, COST_ARMS, resolve_cost, False, ()),
                    (lang_rows, LANG_ARMS, resolve_lang, False, LANG_HEADERS)):
                for row in matrix_rows:
                    for arm in arms[:-1]:
                        t, path, exp = resolve(row, arm)
                        problem = bench.verify(t, path, exp,
                                               accepts_gzip(arm, gzip_client),
                                               headers)
                        log("%-22s %-16s %s" % (row_label(row),
                                                ARM_LABEL[arm],
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
            for name, t in targets.items():
                if not t.alive():
                    log("%s died" % name)
                    failed += 1
            log("smoke: %d answers checked, %d wrong (%d s)" % (
                passed + failed, failed, time.monotonic() - t0))
            ok = failed == 0
            return 0 if ok else 1

        info = machine_info(args)
        log("machine: %(nproc)d cores, %(cpu)s, Linux %(kernel)s, nginx "
            "%(nginx)s, varnish %(varnish)s, wrk %(wrk)s; %(product)s" % info)
        log("%s mode: %d rows x %d arms x %d runs x %d s%s" % (
            args.mode, len(rows), len(MAIN_ARMS), args.runs, args.duration,
            "; cost: %d rows x %d arms x %d runs x %d s" % (
                len(cost_rows), len(COST_ARMS), args.runs,
                args.cost_duration) if cost_rows else "") +
            "; language: %d rows x %d arms" % (len(lang_rows), len(LANG_ARMS)))
        main_res = measure_rows(bench, rows, MAIN_ARMS, resolve_main, True,
                                args.runs, args.duration)
        cost_res = measure_rows(bench, cost_rows, COST_ARMS, resolve_cost,
                                False, args.runs, args.cost_duration)
        lang_res = measure_rows(bench, lang_rows, LANG_ARMS, resolve_lang,
                                False, args.runs, args.cost_duration,
                                LANG_HEADERS)
        for name, t in targets.items():
            if not t.alive():
                raise RuntimeError("%s died during the run" % name)
        elapsed = time.monotonic() - t0
        base, md, plots = write_results(args, info, main_res, cost_res,
                                        lang_res,
                                        started, load_before, loadavg(),
                                        elapsed)
        print()
        print(md)
        log("results: %s.csv, %s.md%s" % (base, base, "".join(
            ", " + p for p in plots)))
        if not args.no_readme:
            update_readme(md, plots)
        ok = True
        return 0
    finally:
        bench.finish(ok, args.keep)


if __name__ == "__main__":
    sys.exit(main())
