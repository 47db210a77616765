"""Integration fixture: Debian's nginx with the built module, a real esid and
a real origin on 127.0.0.1, all in one temporary directory per test.

A test class says what differs from the default configuration; a test
registers what the origin serves, makes a request and compares exact bytes:

    class IncludeTest(EsiTestCase):
        def test_absolute_src_is_included(self):
            self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
            self.origin.route("/esi/x", "X")
            self.assertBody("/page", b"aXc")

Everything a test starts is stopped in tearDown, also on failure (SIGTERM;
NGINX: SIGQUIT to its master and SIGTERM to its workers, esitest.quit_nginx;
then SIGKILL after STOP_BOUND, a hang guard); on failure the nginx error
log, esid's stderr and the origin's log are printed.  After every test the
error log must hold no crashed worker and no [alert]/[emerg] line.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

# tests/support: esitest, the test-support package bench/ uses too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "support"))
# The tests import free_port, poll, STOP_BOUND and the rest from here.
from esitest import (  # noqa: E402,F401
    NGINX, SANITIZER_REPORT, STOP_BOUND, DidNotStart, Process, SlowClient,
    SlowClients, esid_bound_kib, fill, free_port, has_tcp_connections,
    held_socket, memory_kib, nginx_fd_counts, open_fds, poll, sanitized,
    sanitizer_env, start_nginx,
    start_on_socket, start_on_port, tcp_port_answers, tcp_states,
    unix_socket_answers, worker_bound_kib, worker_pids)
from esitest import read_text as _read  # noqa: E402
from esitest.process import terminate_group  # noqa: E402
from esitest import h2, h3  # noqa: E402

from origin import Origin  # noqa: E402

SOURCE_DIR = os.environ.get(
    "ESI_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
BUILD_DIR = os.environ.get("ESI_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
ESID = os.path.join(BUILD_DIR, "esid")
ESICTL = os.path.join(BUILD_DIR, "esictl")
# ESI_MODULE=builtin: nginx has the module compiled in (--add-module, as
# tests/build-matrix.sh builds one), so no load_module line.
MODULE = os.environ.get("ESI_MODULE",
                        os.path.join(BUILD_DIR, "ngx_http_esi_module.so"))

# A hang guard only, as START_BOUND and STOP_BOUND are: nothing asserts on
# elapsed time.
REQUEST_TIMEOUT = float(os.environ.get("ESI_REQUEST_TIMEOUT", "30"))

ERROR_MARKER = b"<!-- ESI include error -->"

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

# The reason HTTP/3 tests give when nginx has no HTTP/3 (tests/expected-skips
# lists it); with ESI_EXPECT_HTTP3=1 (CI's run against an nginx built with
# it) they fail instead.
NO_HTTP3 = "nginx without HTTP/3"

# The line esid logs once it is ready (daemon/esid/main.cc).
ESID_LISTENING = re.compile(r"\besid \S+ listening on ")

# Lines of esid's stderr shown when it did not exit cleanly.
ESID_STDERR_TAIL = 20
# The names spawn() gives esid: "esid-N", "esid-activated-N" and the like,
# and a fleet node's "NODE-esid-N".
ESID_PROCESS = re.compile(r"(?:[^-]+-)?esid")

# A crashed or misbehaving worker shows up as one of these in error.log.
CRASH_RE = re.compile(
    r"exited on signal|core dumped|\[alert\]|\[emerg\]")
SANITIZER_RE = SANITIZER_REPORT
# A sanitized nginx (ESI_SANITIZE builds) writes ASan's and LSan's reports,
# master's and workers', to sanitizer.<pid> in the test's temp dir; UBSan's
# go to stderr, which nginx points at error.log.
SANITIZER_LOG = "sanitizer"
SANITIZER_SUPP = os.path.join(SOURCE_DIR, "tests", "sanitize")

# `env`: NGINX hands a binary upgrade's new nginx only the variables it
# names, and the sanitized build's suppressions are in them.
NGINX_CONF = """\
@@USER@@
worker_processes @@WORKERS@@;
master_process on;
env ASAN_OPTIONS;
env LSAN_OPTIONS;
env UBSAN_OPTIONS;
pid @@TMP@@/nginx.pid;
error_log @@TMP@@/error.log info;
@@LOAD_MODULE@@

events {
    worker_connections 1024;
}

http {
    log_format esi '$request_uri $status $esi_status';
    access_log @@TMP@@/access.log esi;

    client_body_temp_path @@TMP@@/client_body;
    proxy_temp_path @@TMP@@/proxy_temp;
    fastcgi_temp_path @@TMP@@/fastcgi_temp;
    uwsgi_temp_path @@TMP@@/uwsgi_temp;
    scgi_temp_path @@TMP@@/scgi_temp;

    default_type application/octet-stream;

    esi_daemon unix:@@SOCKET@@;
    proxy_cache_path @@TMP@@/cache keys_zone=pages:16m;

@@HTTP@@

    server {
        listen 127.0.0.1:@@PORT@@@@LISTEN@@;
@@QUIC@@
        server_name localhost;

@@SERVER@@

        location / {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache pages;
            proxy_cache_valid 200 10m;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
@@LOCATION@@
        }

        location /esi/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            esi on;
@@FRAGMENT_LOCATION@@
        }

@@LOCATIONS@@
    }
}
"""


class Response:
    """What came back: status, headers, body, and whether it was complete."""

    def __init__(self, status, headers, body, complete, error=None):
        self.status = status
        self.headers = headers
        self.body = body
        self.complete = complete
        self.error = error

    def header(self, name):
        return self.headers.get(name) if self.headers is not None else None

    def __repr__(self):
        return "Response(%r, complete=%r, error=%r, body=%r)" % (
            self.status, self.complete, self.error, self.body[:200])


# UDP beside the TCP listener, on the same port number: the authority an
# HTTP/3 client names is the one an HTTP/1.1 client's Host names.
QUIC_LISTEN = """
        listen 127.0.0.1:@@PORT@@ quic;
        http3 on;
        ssl_certificate @@TMP@@/cert.pem;
        ssl_certificate_key @@TMP@@/key.pem;
"""

_nginx_v = None


def nginx_configure():
    """What `nginx -V` prints (its configure arguments and more)."""
    global _nginx_v
    if _nginx_v is None:
        done = subprocess.run([NGINX, "-V"], stdin=subprocess.DEVNULL,
                              capture_output=True, check=False)
        _nginx_v = (done.stdout + done.stderr).decode(errors="replace")
    return _nginx_v


def nginx_has_http3():
    return "--with-http_v3_module" in nginx_configure()


def esid_log_level(argv):
    """The log level esid's argv gives it: --log-level, else log_level in
    its --config file, else info (daemon/esid/settings.cc)."""
    level, conf = "info", None
    for flag, value in zip(argv, argv[1:]):
        if flag == "--config":
            conf = value
    if conf is not None:
        for line in _read(conf).splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "log_level":
                level = value.strip()
    for flag, value in zip(argv, argv[1:]):
        if flag == "--log-level":
            level = value
    return level


class EsiTestCase(unittest.TestCase):
    """One origin, one esid and one nginx per test, in a fresh temp dir.

    Class attributes are the configuration; a test may change them on
    `self` before its first request, since nginx starts lazily.
    """

    WORKERS = 1
    HTTP = ""               # extra directives in http {}
    SERVER = ""             # extra directives in server {}
    LOCATION = ""           # extra directives in location / {}
    FRAGMENT_LOCATION = ""  # extra directives in location /esi/ {}
    LOCATIONS = ""          # extra location blocks
    LISTEN = ""             # extra parameters of the listen directive
    ESID = True             # start esid before nginx
    USER = None             # the user directive's arguments; None: root
                            # when the tests run as root, else none
    ESID_ARGS = ("--log-level", "debug")
    HTTP2 = False           # listen ... http2 (h2c, prior knowledge) and
                            # fetch() with an HTTP/2 client: see
                            # add_http2_variants
    HTTP3 = False           # listen ... quic on the same port number, with
                            # a certificate made for the test: fetch(...,
                            # http3=True) asks over HTTP/3 (esitest.h3);
                            # skipped where nginx has no HTTP/3 (NO_HTTP3)
    # Regular expressions of [alert] lines NGINX itself logs and the test
    # provokes on purpose (a write to a full disk): not counted as crashes.
    EXPECTED_ALERTS = ()

    maxDiff = 4096

    # -- fixture ---------------------------------------------------------

    def setUp(self):
        for path, what in ((NGINX, "nginx"), (MODULE, "the ESI module"),
                           (ESID, "esid")):
            if path != "builtin" and not os.path.exists(path):
                self.fail("%s not found at %s: build the project first "
                          "(cmake --build %s)" % (what, path, BUILD_DIR))
        if self.HTTP3:
            self._require_http3()
        self.tmp = tempfile.mkdtemp(prefix="esi-it-")
        self.socket_path = os.path.join(self.tmp, "esid.sock")
        self.processes = []
        self.esid = None
        self.nginx = None
        self.port = None
        self.origin = Origin(os.path.join(self.tmp, "origin.log"))
        self.killed = set()     # pids of workers the test killed itself
        self.nodes = []         # add_node(): more nginx + esid pairs
        self.addCleanup(self._teardown)

    def _require_http3(self):
        """Skip (NO_HTTP3) unless nginx has HTTP/3; fail instead where
        ESI_EXPECT_HTTP3=1 says it must.  A missing client always fails."""
        if not nginx_has_http3():
            if os.environ.get("ESI_EXPECT_HTTP3") == "1":
                self.fail("%s (%s), but ESI_EXPECT_HTTP3=1" % (NO_HTTP3,
                                                                NGINX))
            self.skipTest(NO_HTTP3)
        why = h3.available()
        if why is not None:
            self.fail(why)

    def make_certificate(self):
        """A self-signed certificate for localhost, @@TMP@@/cert.pem and
        key.pem, for the test's TLS and QUIC listeners."""
        made = subprocess.run(
            [OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
             "/CN=localhost", "-days", "1",
             "-keyout", os.path.join(self.tmp, "key.pem"),
             "-out", os.path.join(self.tmp, "cert.pem")],
            stdin=subprocess.DEVNULL, capture_output=True, check=False)
        self.assertEqual(made.returncode, 0, made.stderr.decode())

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        super().run(result)
        failed = len(result.failures) + len(result.errors) > before
        tmp = getattr(self, "tmp", None)
        if tmp is None:
            return result
        if failed:
            self._dump_logs()
        if failed and os.environ.get("ESI_KEEP_TMP"):
            sys.stderr.write("kept %s\n" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return result

    def _dump_logs(self):
        out = ["", "=" * 70, "logs of %s (%s)" % (self.id(), self.tmp)]
        names = ["nginx.conf", "error.log", "access.log", "origin.log"]
        names += sorted(n for n in os.listdir(self.tmp)
                        if n.endswith(".stderr") or n.endswith(".stdout")
                        or n.startswith(SANITIZER_LOG + "."))
        for node in self.nodes:
            names += [os.path.join(node.name, "error.log")]
        for name in names:
            text = _read(os.path.join(self.tmp, name))
            if len(text) > 20000:
                text = "[...]\n" + text[-20000:]
            out.append("--- %s ---\n%s" % (name, text))
        sys.stderr.write("\n".join(out) + "\n")

    def _teardown(self):
        # nginx first, so workers let go of esid before it stops.
        for proc in reversed(self.processes):
            proc.stop()
        self.origin.close()
        problems = []
        log = "\n".join(_read(os.path.join(tmp, "error.log"))
                        for tmp in [self.tmp] + [n.tmp for n in self.nodes])
        for line in log.splitlines():
            if (CRASH_RE.search(line) or SANITIZER_RE.search(line)) \
                    and not self._killed_by_test(line) \
                    and not any(re.search(e, line)
                                for e in self.EXPECTED_ALERTS):
                problems.append("error.log: " + line)
        for proc in self.processes:
            for line in proc.stderr().splitlines():
                if SANITIZER_RE.search(line):
                    problems.append("%s: %s" % (proc.name, line))
        # An esid that aborts, segfaults or exits non-zero fails the test,
        # unless the test SIGKILLed it itself (Process.kill, or signal with
        # SIGKILL); stopped with SIGTERM it must exit 0.
        # Any other process must at least have obeyed its stop (NGINX:
        # SIGQUIT, its workers SIGTERM) before the hang guard.
        for proc in self.processes:
            if proc.sigkilled_by_stop and not proc.killed_by_test \
                    and not ESID_PROCESS.match(proc.name):
                problems.append("%s (pid %d) %s" % (
                    proc.name, proc.pid, proc.unclean_exit()))
        for proc in self.processes:
            why = proc.unclean_exit() if ESID_PROCESS.match(proc.name) \
                else None
            if why:
                tail = proc.stderr().splitlines()[-ESID_STDERR_TAIL:]
                problems.append("%s (pid %d) %s; its stderr ends:\n%s" % (
                    proc.name, proc.pid, why,
                    "\n".join("    " + l for l in tail) or "    (empty)"))
        for name in sorted(os.listdir(self.tmp)):
            if name.startswith(SANITIZER_LOG + "."):
                lines = _read(os.path.join(self.tmp, name)).splitlines()
                found = [l for l in lines if SANITIZER_RE.search(l)]
                problems += ["%s: %s" % (name, l) for l in found or lines[:1]]
        if problems:
            more = len(problems) - 20
            raise AssertionError("after the test:\n" + "\n".join(
                problems[:20] + (["... and %d more" % more] if more > 0
                                 else [])))

    # -- starting things -----------------------------------------------

    def spawn(self, name, argv, env=None):
        proc = Process(name, argv, self.tmp, env)
        self.processes.append(proc)
        return proc

    def start_esid(self, *extra, socket_path=None):
        """Start `esid --socket PATH` and wait until it is ready
        (await_listening)."""
        path = socket_path or self.socket_path
        argv = [ESID, "--socket", path] + list(self.ESID_ARGS) + list(extra)
        try:
            proc = start_on_socket(self.spawn, "esid-%d" % len(
                self.processes), argv, path)
        except DidNotStart as e:
            self.fail("esid did not come up on %s (exit %r):\n%s" % (
                path, e.proc.popen.poll(), e.log))
        self.await_listening(proc)
        self.esid = proc
        return proc

    def await_listening(self, proc):
        """Wait (bounded) for esid's "esid VERSION listening on" line, which
        it logs once its socket, metrics endpoint and fleet are up: its
        socket answers a moment before, and on a busy machine a test that
        went on from there could find esid's last words or its metrics
        port still missing.  Not where its log level hides info lines."""
        if esid_log_level(proc.argv) not in ("trace", "debug", "info"):
            return
        if not poll(lambda: not proc.alive()
                    or ESID_LISTENING.search(proc.stderr())) \
                or not proc.alive():
            self.fail("%s never said it was listening (exit %r):\n%s" % (
                proc.name, proc.popen.poll(), proc.stderr()))

    def start_esid_socket_activated(self, *extra, binder=list, daemon=list):
        """esid started by systemd-socket-activate on first connection;
        `binder` and `daemon` may wrap the argv of the one that binds and
        of esid (to run either as another user).  Each execs the next:
        one pid throughout."""
        tool = shutil.which("systemd-socket-activate")
        if tool is None:
            self.fail("systemd-socket-activate not found (packaging/deps.sh "
                      "installs systemd)")
        argv = binder([tool, "-l", self.socket_path] + daemon(
            [ESID] + list(self.ESID_ARGS) + list(extra)))
        # systemd removes what a stopped socket left before it binds;
        # systemd-socket-activate does not.
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        proc = self.spawn("esid-activated-%d" % len(self.processes), argv)
        if not poll(lambda: not proc.alive()
                    or os.path.exists(self.socket_path)) or not proc.alive():
            self.fail("systemd-socket-activate did not listen on %s:\n%s" % (
                self.socket_path, proc.stderr()))

        path = self.socket_path

        def terminate_once_started(proc):
            # esid is told to stop only once it is listening: a SIGTERM
            # before it set up its handler would kill it (a stop a moment
            # after the connection that started it, on a busy machine), as
            # it kills systemd-socket-activate before one came.  So one
            # comes, and esid starts, if it had not.
            if proc.alive() and unix_socket_answers(path):
                poll(lambda: not proc.alive()
                     or ESID_LISTENING.search(proc.stderr()))
            terminate_group(proc)
        proc.ask_to_stop = terminate_once_started
        self.esid = proc
        return proc

    def sanitizer_env(self):
        """The environment with sanitizer reports going to the temp dir."""
        return sanitizer_env(os.path.join(self.tmp, SANITIZER_LOG),
                             SANITIZER_SUPP)

    def nginx_conf(self, tmp=None, socket_path=None, port=None):
        snippets = {
            "HTTP": self.HTTP,
            "SERVER": self.SERVER,
            "LOCATION": self.LOCATION,
            "FRAGMENT_LOCATION": self.FRAGMENT_LOCATION,
            "LOCATIONS": self.LOCATIONS,
            "LISTEN": self.LISTEN + (" http2" if self.HTTP2 else ""),
            "QUIC": QUIC_LISTEN if self.HTTP3 else "",
        }
        values = {
            "USER": ("user %s;" % self.USER if self.USER is not None
                     else "user root;" if os.geteuid() == 0 else ""),
            "WORKERS": str(self.WORKERS),
            "TMP": tmp or self.tmp,
            "LOAD_MODULE": ("" if MODULE == "builtin"
                            else "load_module %s;" % MODULE),
            "SOCKET": socket_path or self.socket_path,
            "PORT": str(port or self.port),
            "ORIGIN": str(self.origin.port),
        }
        # Snippets first: they may use @@ORIGIN@@, @@TMP@@ and the rest.
        return fill(NGINX_CONF, dict(snippets, **values), strict=False)

    def start(self):
        """Start esid (unless ESID is false or it runs) and then nginx."""
        if self.nginx is not None:
            return
        if self.ESID and self.esid is None:
            self.start_esid()
        if self.HTTP3:
            self.make_certificate()

        def conf(port):
            self.port = port
            return self.nginx_conf()
        try:
            self.nginx, _ = start_nginx(self.spawn, "nginx", self.tmp, conf,
                                        self.sanitizer_env())
        except DidNotStart as e:
            self.fail("nginx did not start (exit %r):\n%s" % (
                e.proc.popen.returncode, e.log))

    @property
    def host(self):
        return "127.0.0.1:%d" % self.port

    # -- requests --------------------------------------------------------

    def fetch(self, path, headers=None, method="GET", port=None,
              http3=False, source=None):
        """One request on a new connection (over HTTP/3 with http3, on a
        new QUIC connection); never raises for a bad reply.  `source`: the
        client's own address (HTTP/1.1), such as "127.0.0.2".

        The request runs on a helper thread while this one watches
        error.log, so a worker that crashes fails the test at once instead
        of after REQUEST_TIMEOUT."""
        if port is None:
            self.start()
        outcome = []
        client = threading.Thread(
            target=lambda: outcome.append(
                self._request_h3(method, path, headers, port) if http3
                else self._request(method, path, headers, port, source)),
            daemon=True)
        client.start()
        deadline = time.monotonic() + REQUEST_TIMEOUT + 5
        while client.is_alive() and time.monotonic() < deadline:
            client.join(0.05)
            crash = self._crash_lines()
            if crash:
                self.fail("%s %s: nginx worker crashed:\n%s" % (
                    method, path, "\n".join(crash[:5])))
        if not outcome or outcome[0] is None:
            self.fail("%s %s: no complete answer within %ss (hang)" % (
                method, path, REQUEST_TIMEOUT))
        return outcome[0]

    def _request(self, method, path, headers, port=None, source=None):
        if self.HTTP2:
            return self._request_h2(method, path, headers, port)
        conn = http.client.HTTPConnection(
            "127.0.0.1", port or self.port, timeout=REQUEST_TIMEOUT,
            source_address=(source, 0) if source else None)
        status, hdrs, body = None, None, b""
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            status, hdrs = resp.status, resp.headers
            body = resp.read()
            return Response(status, hdrs, body, True)
        except http.client.IncompleteRead as e:
            return Response(status, hdrs, body + e.partial, False, e)
        except socket.timeout:
            return None
        except (http.client.HTTPException, OSError) as e:
            return Response(status, hdrs, body, False, e)
        finally:
            conn.close()

    def _request_h2(self, method, path, headers, port=None):
        reply = h2.request("http://127.0.0.1:%d%s" % (port or self.port,
                                                      path),
                           method, headers, REQUEST_TIMEOUT)
        if reply.timed_out:
            return None
        return Response(reply.status, reply.headers, reply.body,
                        reply.complete, reply.error)

    def _request_h3(self, method, path, headers, port=None):
        reply = h3.request("https://127.0.0.1:%d%s" % (port or self.port,
                                                       path),
                           method, headers, REQUEST_TIMEOUT, self.tmp)
        if reply.timed_out:
            return None
        return Response(reply.status, reply.headers, reply.body,
                        reply.complete, reply.error)

    def _crash_lines(self):
        return [line for line in self.error_log().splitlines()
                if "exited on signal" in line
                and not self._killed_by_test(line)]

    def _killed_by_test(self, line):
        return any("worker process %d exited on signal 9" % pid in line
                   for pid in self.killed)

    def kill_worker(self, pid):
        """SIGKILL a worker; the master's report of it is no crash."""
        self.killed.add(pid)
        os.kill(pid, signal.SIGKILL)

    def get(self, path, headers=None, http3=False):
        """GET that must complete: returns (status, headers, body)."""
        r = self.fetch(path, headers, http3=http3)
        if not r.complete:
            self.fail("GET %s%s: incomplete response (%r)" % (
                path, " over HTTP/3" if http3 else "", r.error))
        return r.status, r.headers, r.body

    def assertBody(self, path, expected, status=200, headers=None):
        got_status, _, body = self.get(path, headers)
        self.assertEqual(body, expected, "body of GET %s" % path)
        self.assertEqual(got_status, status, "status of GET %s" % path)
        return body

    # -- looking at what happened ------------------------------------------

    def access_log(self, count, name="access.log"):
        """The first `count` lines of an access log (by default the
        harness's), waiting for them (bounded): nginx writes the line after
        the response has gone out."""
        path = os.path.join(self.tmp, name)
        lines = poll(lambda: (lambda ls: ls if len(ls) >= count else None)(
            _read(path).splitlines()), bound=10.0)
        if not lines:
            self.fail("access.log has fewer than %d lines:\n%s" % (
                count, _read(path)))
        return lines[:count]

    def esi_status(self, nth):
        """$esi_status logged for the nth (1-based) request of the test."""
        fields = self.access_log(nth)[nth - 1].split()
        return fields[2] if len(fields) > 2 else ""

    def error_log(self):
        return _read(os.path.join(self.tmp, "error.log"))

    def esid_warnings(self, uri):
        """What esid's warning lines about the page `uri` say, in order:
        the text after `warning "URI": `."""
        mark = ' warning "%s": ' % uri
        return [line.split(mark, 1)[1]
                for line in self.esid.stderr().splitlines() if mark in line]

    def assertWarned(self, uri, warnings):
        """esid warned of exactly `warnings` about `uri` (waiting, bounded,
        for as many lines: esid may write them after the answer)."""
        poll(lambda: len(self.esid_warnings(uri)) >= len(warnings),
             bound=10.0)
        self.assertEqual(self.esid_warnings(uri), list(warnings),
                         "esid's warnings about %s" % uri)

    def worker_pids(self):
        """Pids of the nginx master's worker processes."""
        return worker_pids(self.nginx.pid)

    def fd_counts(self):
        """esitest.nginx_fd_counts of this test's nginx and esid."""
        return nginx_fd_counts(self.nginx.pid, self.esid.pid)

    def steady_fd_counts(self, expected=None):
        """fd counts once no process holds a TCP connection (the client's
        and the upstream's close asynchronously) and, given `expected`,
        once they equal it (bounded: then as they are)."""
        pids = [self.nginx.pid] + self.worker_pids()

        def steady():
            states = tcp_states()
            if any(has_tcp_connections(p, states) for p in pids):
                return None
            counts = self.fd_counts()
            return counts if expected in (None, counts) else None

        return poll(steady, bound=10.0) or self.fd_counts()

    def esictl(self, *args, socket_path=None):
        """Run build/esictl; returns the CompletedProcess."""
        if not os.path.exists(ESICTL):
            self.fail("esictl not found at %s" % ESICTL)
        argv = [ESICTL, "--socket", socket_path or self.socket_path] + \
            list(args)
        return subprocess.run(argv, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=REQUEST_TIMEOUT)

    def stats(self):
        """`esictl stats` as a dict of name -> int."""
        r = self.esictl("stats")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        values = {}
        for line in r.stdout.decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                values[parts[0]] = int(parts[1])
        return values

    def stats_json(self):
        r = self.esictl("stats", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return json.loads(r.stdout)

    # -- several nodes -----------------------------------------------------

    def add_node(self, name):
        """Another nginx + esid pair, with this class's configuration, the
        same origin, and a directory of its own (cache, socket, logs)
        under the test's: the nodes of a fleet."""
        node = Node(self, name)
        self.nodes.append(node)
        return node


def http1_only(test):
    """Marks a test that speaks HTTP/1.1 itself (a raw socket, HTTP/1.0,
    a client that stops reading): add_http2_variants leaves it out."""
    test.http1_only = True
    return test


def add_http2_variants(namespace):
    """Beside every test class of a module (its globals()), one that runs
    the same tests over HTTP/2: FooTest gets FooHttp2Test, whose listener
    is `http2` and whose fetch(), get() and assertBody() use an HTTP/2
    client (curl); the assertions are the same bytes.  Tests marked
    http1_only are not repeated."""
    module = namespace["__name__"]
    for name, cls in list(namespace.items()):
        if not (isinstance(cls, type) and issubclass(cls, EsiTestCase)
                and cls.__module__ == module and not cls.HTTP2):
            continue
        tests = [m for m in dir(cls) if m.startswith("test")
                 and callable(getattr(cls, m))]
        if not tests:
            continue        # a base class of the module's tests
        attrs = {"HTTP2": True, "__module__": module,
                 "__doc__": "%s, over HTTP/2." % name}
        for m in tests:
            if getattr(getattr(cls, m), "http1_only", False):
                attrs[m] = None     # not callable: the loader skips it
        stem = name[:-4] if name.endswith("Test") else name
        namespace[stem + "Http2Test"] = type(stem + "Http2Test", (cls,),
                                             attrs)


class Node:
    """One NGINX and its esid beside the test's own (EsiTestCase.add_node)."""

    def __init__(self, test, name):
        self.test = test
        self.name = name
        self.tmp = os.path.join(test.tmp, name)
        os.mkdir(self.tmp)
        self.socket_path = os.path.join(self.tmp, "esid.sock")
        self.port = None
        self.esid = None
        self.nginx = None

    def start_esid(self, *extra):
        argv = [ESID, "--socket", self.socket_path] + \
            list(self.test.ESID_ARGS) + list(extra)
        try:
            proc = start_on_socket(self.test.spawn, "%s-esid-%d" % (
                self.name, len(self.test.processes)), argv, self.socket_path)
        except DidNotStart as e:
            self.test.fail("%s: esid did not come up (exit %r):\n%s" % (
                self.name, e.proc.popen.poll(), e.log))
        self.test.await_listening(proc)
        self.esid = proc
        return proc

    def start_nginx(self):
        def conf(port):
            self.port = port
            return self.test.nginx_conf(self.tmp, self.socket_path, port)
        try:
            self.nginx, _ = start_nginx(self.test.spawn, "%s-nginx" % self.name,
                                        self.tmp, conf,
                                        self.test.sanitizer_env())
        except DidNotStart as e:
            self.test.fail("%s: nginx did not start:\n%s" % (self.name,
                                                              e.log))

    def fetch(self, path, headers=None, method="GET"):
        return self.test.fetch(path, headers, method, port=self.port)

    def get(self, path, headers=None):
        r = self.fetch(path, headers)
        if not r.complete:
            self.test.fail("%s: GET %s: incomplete (%r)" % (self.name, path,
                                                            r.error))
        return r.status, r.headers, r.body

    def esictl(self, *args):
        return self.test.esictl(*args, socket_path=self.socket_path)

    def error_log(self):
        return _read(os.path.join(self.tmp, "error.log"))

    def cache_files(self):
        """Names of the cache files on disk, sorted."""
        found = []
        for _, _, names in os.walk(os.path.join(self.tmp, "cache")):
            found += [n for n in names if len(n) == 32]
        return sorted(found)
