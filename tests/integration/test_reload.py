"""Reload and binary upgrade under load (issue #23, item 3): `nginx -s
reload` every second for 30 s, and a binary upgrade (USR2, WINCH, QUIT),
while keep-alive clients fetch ESI pages, plain and gzip (stitched), and a
loop purges the page.

Every response is checked whole.  A failed request is a connection error, a
status other than 200 or a wrong body; none is allowed.  A request sent on a
kept-alive connection that the server closed before answering it (an old
worker shutting down closes its idle connections) is sent again on a new
one, as HTTP clients do (RFC 9112, 9.3.1), and counted apart.  No page
may be passed through unprocessed: every GET's $esi_status is "processed".
Afterwards esid has one connection per living worker and nothing left open:
no streams, no segment pins, no retired pin tables, its fd count as before.
"""

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
import zlib

from harness import (NGINX, REQUEST_TIMEOUT, EsiTestCase, _read, free_port,
                     open_fds, poll, tcp_port_answers, worker_pids)


RELOADS = int(os.environ.get("ESI_TEST_RELOADS", "30"))
RELOAD_PERIOD = 1.0     # the spec: a reload every second
CLIENTS = 6             # keep-alive clients, every other one gzip
PURGE_EVERY = 25        # GETs served between two purges
INCLUDES = 4
# GETs served after the upgrade's last step, on the new master alone.
AFTER_UPGRADE = 200

PAGE = "".join('<p>text %d</p><esi:include src="/esi/f%d"/>' % (i, i)
               for i in range(INCLUDES)) + "<p>" + "end " * 100 + "</p>"
BODY = ("".join("<p>text %d</p>[f%d]" % (i, i) for i in range(INCLUDES))
        + "<p>" + "end " * 100 + "</p>").encode()

LOAD_LOG = """
    log_format load '$request_method $status $esi_status';
    access_log @@TMP@@/load.log load;
"""
PURGED_GZIP_LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
            gzip on;
"""
# What esid holds for one worker or request; all must come back.
BASELINE = ("active_connections", "active_streams", "segment_pins",
            "segment_retired_pin_tables")
RETRIABLE = (http.client.RemoteDisconnected, ConnectionResetError,
             BrokenPipeError)


class Load:
    """CLIENTS keep-alive clients GETting /page, and a purger, until
    stop(); every response checked."""

    def __init__(self, port):
        self.port = port
        self.stopping = threading.Event()
        self.lock = threading.Condition()
        self.served = 0
        self.resent = 0
        self.purges = 0
        self.failures = []
        self.threads = [threading.Thread(target=self._client, args=(i % 2,),
                                         daemon=True)
                        for i in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self._purger,
                                             daemon=True))
        for t in self.threads:
            t.start()

    def _connection(self):
        return http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=REQUEST_TIMEOUT)

    def _exchange(self, conn, method, headers):
        """(connection to use next, status, headers, body); status None on
        a request to send again (RETRIABLE on a kept-alive connection)."""
        reused = conn is not None
        conn = conn or self._connection()
        try:
            conn.request(method, "/page", headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except RETRIABLE as e:
            conn.close()
            if reused:
                return None, None, None, None
            raise e
        except (http.client.HTTPException, OSError):
            conn.close()
            raise
        if resp.will_close:
            conn.close()
            conn = None
        return conn, resp.status, resp.headers, body

    def _client(self, gzip):
        headers = {"Accept-Encoding": "gzip"} if gzip else {}
        conn = None
        while not self.stopping.is_set():
            try:
                conn, status, hdrs, body = self._exchange(conn, "GET",
                                                          headers)
            except (http.client.HTTPException, OSError) as e:
                self._fail("GET: %r" % e)
                conn = None
                continue
            if status is None:
                with self.lock:
                    self.resent += 1
                continue
            if gzip and hdrs.get("Content-Encoding") == "gzip":
                try:
                    body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
                except zlib.error as e:
                    self._fail("GET gzip: %r" % e)
                    continue
            if status != 200 or body != BODY:
                self._fail("GET: %r %r" % (status, body[:200]))
                continue
            with self.lock:
                self.served += 1
                self.lock.notify_all()

    def _purger(self):
        conn = None
        while True:
            with self.lock:
                due = self.purges * PURGE_EVERY + PURGE_EVERY
                self.lock.wait_for(lambda: self.stopping.is_set()
                                   or self.served >= due)
            if self.stopping.is_set():
                return
            try:
                conn, status, _, _ = self._exchange(conn, "PURGE", {})
            except (http.client.HTTPException, OSError) as e:
                self._fail("PURGE: %r" % e)
                conn = None
                continue
            if status is None:
                continue
            if status not in (200, 404):     # purged, or not cached now
                self._fail("PURGE: %r" % status)
            with self.lock:
                self.purges += 1

    def _fail(self, what):
        with self.lock:
            self.failures.append(what)

    def wait_served(self, count):
        """Until `count` more GETs have been served (bounded)."""
        with self.lock:
            target = self.served + count
            return self.lock.wait_for(lambda: self.served >= target,
                                      timeout=REQUEST_TIMEOUT)

    def stop(self):
        self.stopping.set()
        with self.lock:
            self.lock.notify_all()
        for t in self.threads:
            t.join(REQUEST_TIMEOUT + 5)


class ReloadTestCase(EsiTestCase):
    WORKERS = 2
    HTTP = LOAD_LOG
    LOCATION = PURGED_GZIP_LOCATION

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE)
        for i in range(INCLUDES):
            self.origin.route("/esi/f%d" % i, "[f%d]" % i)

    def esid_state(self):
        stats = self.stats_json()
        return dict({k: stats[k] for k in BASELINE},
                    fds=len(open_fds(self.esid.pid)))

    def idle(self, workers):
        """esid's state once it has `workers` connections and nothing open
        (bounded; then as it is): the baseline."""
        def settled():
            state = self.esid_state()
            return state if [state[k] for k in BASELINE] == [
                workers, 0, 0, 0] else None
        return poll(settled, bound=30.0) or self.esid_state()

    def back_to(self, baseline):
        """esid's state once it is `baseline` again (bounded)."""
        return poll(lambda: (lambda state: state if state == baseline
                             else None)(self.esid_state()),
                    bound=30.0) or self.esid_state()

    def assertLoadClean(self, load, what):
        sys.stderr.write(
            "\n  %s: %d GETs served, %d sent again on a new connection, "
            "%d purges, %d failed\n" % (what, load.served, load.resent,
                                        load.purges, len(load.failures)))
        self.assertEqual(load.failures[:10], [], "%d failed requests" %
                         len(load.failures))
        self.assertGreater(load.purges, 0)
        self.access_log(load.served + load.purges, "load.log")
        lines = [line.split() for line in
                 _read(os.path.join(self.tmp, "load.log")).splitlines()]
        gets = [line for line in lines if line[0] == "GET"]
        unprocessed = [line for line in gets if line[1:] != ["200",
                                                             "processed"]]
        self.assertEqual(unprocessed[:10], [],
                         "%d of %d GETs not processed" % (len(unprocessed),
                                                          len(gets)))

    def nginx_command(self, *args):
        """nginx with the test's prefix, error log and configuration, and
        `args` (a daemonized start, or -s SIGNAL), which must succeed.
        The signaller and a daemonized start's parent exit without freeing
        main()'s init_cycle pool (NGINX's), so in a sanitized build
        LeakSanitizer is off for what this starts: a daemonized master and
        its workers inherit that; ASan and UBSan stay on."""
        env = self.sanitizer_env()
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
        done = subprocess.run(
            [NGINX, "-p", self.tmp + "/", "-e",
             os.path.join(self.tmp, "error.log"), "-c",
             os.path.join(self.tmp, "nginx.conf")] + list(args),
            stdin=subprocess.DEVNULL, capture_output=True,
            env=env, timeout=REQUEST_TIMEOUT, check=False)
        self.assertEqual(done.returncode, 0, done.stderr.decode())

    def warm(self):
        self.assertBody("/page", BODY)
        self.assertBody("/page", BODY)
        _, hdrs, raw = self.get("/page", {"Accept-Encoding": "gzip"})
        self.assertEqual(hdrs.get("Content-Encoding"), "gzip")
        self.assertEqual(zlib.decompress(raw, 16 + zlib.MAX_WBITS), BODY)


class ReloadUnderLoadTest(ReloadTestCase):

    def test_reloads_every_second_lose_no_request_and_no_session(self):
        self.start()
        self.warm()
        baseline = self.idle(self.WORKERS)
        load = Load(self.port)
        try:
            self.assertTrue(load.wait_served(50), "the load did not start")
            for _ in range(RELOADS):
                self.nginx_command("-s", "reload")
                time.sleep(RELOAD_PERIOD)   # the spec's period, not a sync
            # the last reload's workers serve too
            self.assertTrue(load.wait_served(50))
        finally:
            load.stop()
        self.assertTrue(poll(lambda: len(self.worker_pids()) ==
                             self.WORKERS, bound=60.0),
                        "old workers still run: %r" % self.worker_pids())
        self.assertEqual(self.error_log().count("(SIGHUP) received"),
                         RELOADS)
        self.assertLoadClean(load, "%d reloads" % RELOADS)
        self.assertEqual(self.back_to(baseline), baseline)


class BinaryUpgradeTest(ReloadTestCase):
    """USR2, WINCH, QUIT: nginx daemonized, since a master in the
    foreground ignores USR2 while the parent that started it runs (its
    new binary could not tell its parent from the old master)."""

    def start(self):
        if self.nginx is not None:
            return
        self.start_esid()
        self.port = free_port()
        with open(os.path.join(self.tmp, "nginx.conf"), "w") as f:
            f.write(self.nginx_conf())
        self.addCleanup(self.stop_masters)
        self.nginx_command()                 # daemon on: nginx's default
        self.assertTrue(poll(lambda: tcp_port_answers(self.port)))
        self.nginx = self.master()

    def pid_file(self, suffix=""):
        return os.path.join(self.tmp, "nginx.pid" + suffix)

    def master(self, suffix=""):
        try:
            with open(self.pid_file(suffix)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def stop_masters(self):
        """TERM each master left, then KILL after a bounded wait."""
        pids = [p for p in (self.master(), self.master(".oldbin")) if p]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if poll(lambda: not any(alive(p) for p in pids), bound=10.0):
                return

    def worker_pids(self):
        return worker_pids(self.nginx)

    def test_a_binary_upgrade_loses_no_request_and_no_session(self):
        self.start()
        self.warm()
        baseline = self.idle(self.WORKERS)
        old = self.nginx
        load = Load(self.port)
        try:
            self.assertTrue(load.wait_served(50), "the load did not start")
            os.kill(old, signal.SIGUSR2)
            new = poll(lambda: self.master(".oldbin") == old and
                       self.master() not in (None, old) and self.master())
            self.assertTrue(new, "no new master:\n" + self.error_log())
            self.assertTrue(poll(lambda: len(worker_pids(new)) ==
                                 self.WORKERS))
            self.assertTrue(poll(lambda: self.stats_json()[
                "active_connections"] == 2 * self.WORKERS),
                "the new workers did not attach to esid")
            self.assertTrue(load.wait_served(50))
            os.kill(old, signal.SIGWINCH)      # its workers finish, exit
            self.assertTrue(poll(lambda: worker_pids(old) == []),
                            "the old master's workers still run")
            os.kill(old, signal.SIGQUIT)
            self.assertTrue(poll(lambda: not alive(old)),
                            "the old master still runs")
            self.nginx = new
            self.assertTrue(load.wait_served(AFTER_UPGRADE))
        finally:
            load.stop()
        self.assertFalse(os.path.exists(self.pid_file(".oldbin")))
        self.assertLoadClean(load, "binary upgrade")
        self.assertEqual(self.back_to(baseline), baseline)


def alive(pid):
    """True while `pid` runs (a zombie of another parent counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
