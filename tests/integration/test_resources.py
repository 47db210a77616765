"""Resource bounds.

File descriptors: the nginx master's, each worker's and esid's open fds are
counted in steady state (every worker attached, no TCP connection but the
listening ones), then esid is restarted five times and nginx reloaded twice
and restarted once, a page served after each; the counts must come back to
where they were.

Memory: esid's resident set with 10,000 streams open at once stays under
a fixed overhead plus a per-stream bound derived from esid's limits, and a
second round of 10,000 reuses what the first freed.  The streams are opened
through nginx without 10,000 clients: forty pages of 250 includes each
(esi_max_includes is 256), whose fragments come from an origin that sends
their head (ending inside an ESI tag, which the parser must hold) and then
holds the rest until nginx hangs up.  tests/README.md has the figures.
"""

import asyncio
import http.client
import os
import re
import resource
import signal
import sys
import threading
import unittest

from harness import (ESID, EsiTestCase, REQUEST_TIMEOUT, esid_bound_kib,
                     memory_kib, poll, sanitized)

ATTACHED_RE = re.compile(r"(\d+)#\d+: esi: attached to esid pid (\d+)")


class FdLeakTest(EsiTestCase):
    WORKERS = 2
    ESID_ARGS = ("--log-level", "info")
    ESID_RESTARTS = 5
    NGINX_RELOADS = 2

    def setUp(self):
        super().setUp()
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")

    def attached_workers(self):
        """Worker pids that attached to the running esid."""
        return {int(w) for w, e in ATTACHED_RE.findall(self.error_log())
                if int(e) == self.esid.pid}

    def wait_for_attached_workers(self):
        """Until exactly WORKERS workers run, every one attached to the
        running esid (a reload's old workers gone)."""
        def attached():
            workers = self.worker_pids()
            return (len(workers) == self.WORKERS
                    and set(workers) <= self.attached_workers() and workers)
        workers = poll(attached)
        if not workers:
            self.fail("workers %r not all attached to esid %d:\n%s" % (
                self.worker_pids(), self.esid.pid, self.error_log()[-3000:]))
        return workers

    def serve_page(self):
        self.start()
        self.wait_for_attached_workers()
        self.assertBody("/page", b"aXc")

    def test_fds_come_back_to_their_count_after_esid_and_nginx_restarts(self):
        self.serve_page()
        before = self.steady_fd_counts()

        for n in range(self.ESID_RESTARTS):
            # Clean stops and crashes, alternately.
            if n % 2:
                self.esid.kill()
            else:
                self.esid.stop()
            self.start_esid()
            self.serve_page()
        after_esid = self.steady_fd_counts(before)

        for _ in range(self.NGINX_RELOADS):
            old = set(self.worker_pids())
            self.nginx.signal(signal.SIGHUP)
            if not poll(lambda: not old & set(self.worker_pids())):
                self.fail("old workers %r still run after reload" % old)
            self.serve_page()
        after_reload = self.steady_fd_counts(before)

        self.nginx.stop()
        self.nginx = None
        self.start()
        self.serve_page()
        after_restart = self.steady_fd_counts(before)

        sys.stderr.write(
            "\n  fd counts: before %r, after %d esid restarts %r, after %d "
            "reloads %r, after an nginx restart %r\n" % (
                before, self.ESID_RESTARTS, after_esid, self.NGINX_RELOADS,
                after_reload, after_restart))
        self.assertEqual(after_esid, before, "after esid restarts")
        self.assertEqual(after_reload, before, "after nginx reloads")
        self.assertEqual(after_restart, before, "after an nginx restart")


class StallingOrigin:
    """An origin for thousands of held responses at once: each request gets
    its headers and `head` at once, and then nothing more (a byte short of
    its Content-Length) until nginx closes the connection, or HOLD_BOUND
    passes.  asyncio: a held response costs a socket, not a thread."""

    HOLD_BOUND = 60.0

    def __init__(self, head):
        self.head = head
        self.held = 0
        self.loop = asyncio.new_event_loop()
        self.port = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,),
                                       daemon=True)
        self.thread.start()
        ready.wait(10.0)

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(
            self._serve, "127.0.0.1", 0, backlog=4096))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(
            asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _serve(self, reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                         % (len(self.head) + 1) + self.head)
            await writer.drain()
            self.held += 1
            try:
                await asyncio.wait_for(reader.read(1), self.HOLD_BOUND)
            finally:
                self.held -= 1
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                asyncio.CancelledError):
            pass  # nginx left, the bound passed, or the test is over
        finally:
            writer.close()

    def close(self):
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10.0)


ESID_SANITIZED = os.path.exists(ESID) and sanitized(ESID)
# How many streams to hold open (fewer under ASan); ESI_TEST_STREAMS
# overrides it for a manual run (tests/README.md).
STREAMS = int(os.environ.get("ESI_TEST_STREAMS",
                             "2000" if ESID_SANITIZED else "10000"))
PAGES = 40
# A fragment's head: text esid must not keep (verbatim runs are offsets),
# then an ESI tag cut short, which it must (up to maxTagBytes, 8 KiB).
FRAGMENT_HEAD = b"<p>held</p>" * 400 + b'<esi:comment text="' + b"x" * 7000



class StreamMemoryTest(EsiTestCase):
    WORKERS = 2
    ESID_ARGS = ("--log-level", "info")
    # Each worker may hold every fragment's upstream connection.
    WORKER_CONNECTIONS = STREAMS + 1024
    STREAMS_BOUND = 60.0

    def setUp(self):
        super().setUp()
        # The stalling origin holds a socket per stream, in this process.
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < STREAMS + 1024:
            self.skipTest("RLIMIT_NOFILE's hard limit %d is too low for %d "
                          "streams (ESI_TEST_STREAMS)" % (hard, STREAMS))
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.rlimit = min(hard, STREAMS + 4096)
        self.stall = StallingOrigin(FRAGMENT_HEAD)
        self.addCleanup(self.stall.close)
        self.LOCATIONS = """
        location /held/ {
            proxy_pass http://127.0.0.1:%d;
            # Unbuffered, and the head in one buffer: nginx passes it on
            # as it arrives.
            proxy_buffering off;
            proxy_buffer_size 16k;
            proxy_buffers 4 16k;
            esi on;
        }""" % self.stall.port
        includes = STREAMS // PAGES
        self.origin.route("/fanout", "".join(
            '<esi:include src="/held/%d"/>' % i for i in range(includes)))

    def nginx_conf(self):
        conf = super().nginx_conf()
        conf = conf.replace("worker_connections 1024;",
                            "worker_connections %d;"
                            % self.WORKER_CONNECTIONS)
        return conf.replace("master_process on;\n",
                            "master_process on;\nworker_rlimit_nofile %d;\n"
                            % self.rlimit)

    def active_streams(self):
        return self.stats_json()["active_streams"]

    def hold_streams(self, round_):
        """Opens STREAMS streams, measures esid, lets them go: returns
        (streams opened, VmRSS... with them open, ... once they are gone)."""
        clients = []
        for n in range(PAGES):
            conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                              timeout=REQUEST_TIMEOUT)
            conn.request("GET", "/fanout?page=%d&round=%d" % (n, round_))
            clients.append(conn)
            self.addCleanup(conn.close)
        opened = poll(lambda: self.active_streams() >= STREAMS,
                      bound=self.STREAMS_BOUND, interval=0.2)
        streams = self.active_streams()
        peak = memory_kib(self.esid.pid)
        # The clients leave: nginx ends the pages and their fragments, and
        # tells esid to forget every stream.
        for conn in clients:
            conn.close()
        closed = poll(lambda: self.active_streams() == 0
                      and self.stall.held == 0, bound=30.0, interval=0.2)
        after = memory_kib(self.esid.pid)
        self.assertTrue(opened, "only %d of %d streams opened" % (
            streams, STREAMS))
        self.assertTrue(closed, "%d streams, %d fragments still open after "
                        "the clients left" % (self.active_streams(),
                                              self.stall.held))
        return streams, peak, after

    def test_esid_memory_with_ten_thousand_streams_stays_in_its_bound(self):
        self.origin.route("/warm", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.assertBody("/warm", b"aXc")
        idle = memory_kib(self.esid.pid)

        streams, peak, after = self.hold_streams(1)
        # Twice: memory the first streams left behind would add up.
        _, again, after_again = self.hold_streams(2)

        connections = self.stats_json()["active_connections"]
        bound = esid_bound_kib(connections, streams)
        sys.stderr.write(
            "\n  esid RSS (KiB): idle %r; %d streams %r, after %r; again "
            "%r, after %r; bound %d KiB (%d connections); %.1f KiB a stream\n"
            % (idle, streams, peak, after, again, after_again, bound,
               connections, (peak["VmRSS"] - idle["VmRSS"]) / streams))
        if ESID_SANITIZED:
            return  # streams opened and closed twice; no bound under ASan
        self.assertLessEqual(peak["VmRSS"], bound)
        self.assertLessEqual(again["VmRSS"], bound)
        # The second round reuses what the first freed: no growth beyond
        # a tenth of the first round's own cost.
        # (RssAnon: the heap; the rings' pages are touched as they wrap.)
        self.assertLessEqual(again["RssAnon"] - peak["RssAnon"],
                             (peak["RssAnon"] - idle["RssAnon"]) // 10)


# Hang guard for the request below: it is small, but hangs while the bug
# stands.
UNBUFFERED_GUARD = 5.0


class UnbufferedUpstreamTest(EsiTestCase):
    """Found by StreamMemoryTest, whose fragments come unbuffered: an
    unbuffered upstream signals the end of the body only once its one
    buffer is consumed, while esid may keep the last bytes until the end;
    the module holds a copy of such input so that neither waits for ever."""

    LOCATION = "proxy_buffering off;"

    def fetch_whole(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=UNBUFFERED_GUARD)
        self.addCleanup(conn.close)
        conn.request("GET", path)
        try:
            return conn.getresponse().read()
        except OSError as e:
            self.fail("no complete answer within %ss: %r" % (
                UNBUFFERED_GUARD, e))

    def test_a_page_from_an_unbuffered_upstream_completes(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.start()
        self.assertEqual(self.fetch_whole("/page"), b"aXc")


if __name__ == "__main__":
    unittest.main()
