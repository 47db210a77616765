"""When esid is missing, dies, stalls or talks nonsense, nginx still answers:
per esi_fallback (default passthrough: the page goes out unprocessed), within
esi_daemon_timeout, and the worker survives (the harness fails any test whose
error.log shows a worker exiting on a signal or an [alert])."""

import os
import signal
import socket
import threading
import unittest

from harness import EsiTestCase, poll

PAGE = 'a<esi:include src="/esi/x"/>c'
PROCESSED = b"aXc"
RAW = PAGE.encode()
RECOVERY_BOUND = 20.0


class FaultTestCase(EsiTestCase):
    HTTP = "esi_daemon_timeout 1s;"

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def poll_until_processed(self):
        """Request the page until it is processed again (bounded)."""
        bodies = []

        def processed():
            _, _, body = self.get("/page")
            bodies.append(body)
            return body == PROCESSED

        if not poll(processed, bound=RECOVERY_BOUND, interval=0.1):
            self.fail("page not processed again within %ss; last bodies: %r"
                      % (RECOVERY_BOUND, bodies[-3:]))


class EsidNotRunningTest(FaultTestCase):
    ESID = False

    def test_page_is_served_unprocessed(self):
        self.assertBody("/page", RAW)

    def test_esi_status_is_passthrough(self):
        self.assertBody("/page", RAW)
        self.assertEqual(self.esi_status(1), "passthrough")

    def test_repeated_requests_are_all_served_unprocessed(self):
        for _ in range(5):
            self.assertBody("/page", RAW)

    def test_page_is_processed_once_esid_starts(self):
        self.assertBody("/page", RAW)
        self.start_esid()
        self.poll_until_processed()


class FallbackAbortTest(FaultTestCase):
    ESID = False
    LOCATION = "esi_fallback abort;"

    def test_client_never_gets_a_complete_page(self):
        r = self.fetch("/page")
        # Either the connection is cut before the page is complete, or an
        # error status is answered; never the page as if all went well.
        self.assertTrue(not r.complete or r.status >= 500, r)
        self.assertNotEqual(r.body, RAW)

    def test_esi_status_is_aborted(self):
        r = self.fetch("/page")
        # esid is known to be absent before the header goes out: the
        # connection is closed with nothing sent, not a byte of the page
        self.assertEqual((r.status, r.complete, r.body), (None, False, b""),
                         r)
        self.assertEqual(self.esi_status(1), "aborted")


class EsidKilledTest(FaultTestCase):

    def test_request_while_esid_is_dead_is_passthrough(self):
        self.assertBody("/page", PROCESSED)
        self.esid.kill()
        self.assertBody("/page", RAW)
        self.assertEqual(self.esi_status(2), "passthrough")

    def test_page_is_processed_again_after_esid_restarts(self):
        self.assertBody("/page", PROCESSED)
        self.esid.kill()
        self.assertBody("/page", RAW)
        self.start_esid()
        self.poll_until_processed()

    def test_first_request_after_restart_is_processed(self):
        # The issue: "the next request after esid is back is processed
        # normally" -- no warm-up request in between.
        self.assertBody("/page", PROCESSED)
        self.esid.kill()
        self.start_esid()
        self.assertBody("/page", PROCESSED)

    def test_esid_killed_mid_response_the_request_still_completes(self):
        released = self.origin.hold("/esi/hold")
        tail = "b" + "<p>tail</p>" * 20000 + "c"
        raw = ('a<esi:include src="/esi/hold"/>' + tail).encode()
        self.origin.route("/page", raw.decode())
        self.origin.route("/esi/hold", "H")
        self.start()
        result = []
        client = threading.Thread(
            target=lambda: result.append(self.fetch("/page")))
        client.start()
        try:
            self.assertTrue(self.origin.wait_for_hits("/esi/hold"))
            self.esid.kill()
        finally:
            released.set()
            client.join(60)
        self.assertFalse(client.is_alive(), "request hung")
        r = result[0]
        self.assertTrue(r.complete, r)
        self.assertEqual(r.status, 200)
        # Passthrough from where esid failed: the include esid asked for
        # is served, or its tag passed through raw; the tail is whole.
        allowed = {"raw": raw, "assembled": ("aH" + tail).encode()}
        self.assertIn(r.body, allowed.values(),
                      "neither %s: %r ... %r (%d bytes)" % (
                          " nor ".join(allowed), r.body[:60], r.body[-20:],
                          len(r.body)))
        self.assertEqual(self.esi_status(1), "passthrough")

    def test_worker_survives_esid_faults(self):
        self.assertBody("/page", PROCESSED)
        workers = self.worker_pids()
        self.assertEqual(len(workers), 1)
        self.esid.kill()
        self.assertBody("/page", RAW)
        self.start_esid()
        self.poll_until_processed()
        self.esid.signal(signal.SIGSTOP)
        self.assertBody("/page", RAW)
        self.esid.signal(signal.SIGCONT)
        self.poll_until_processed()
        self.assertEqual(self.worker_pids(), workers)


class EsidStoppedTest(FaultTestCase):
    """SIGSTOP: connect works, nothing answers; esi_daemon_timeout 1s."""

    def test_request_completes_by_fallback_when_esid_is_stopped(self):
        self.assertBody("/page", PROCESSED)
        self.esid.signal(signal.SIGSTOP)
        self.assertBody("/page", RAW)
        self.assertEqual(self.esi_status(2), "passthrough")

    def test_page_is_processed_again_after_sigcont(self):
        self.assertBody("/page", PROCESSED)
        self.esid.signal(signal.SIGSTOP)
        self.assertBody("/page", RAW)
        self.esid.signal(signal.SIGCONT)
        self.poll_until_processed()


class GarbageDaemon:
    """A Unix socket that answers every connection with nonsense."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.stopping = False
        self.closed = False
        self.conns = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.conns.append(conn)
            try:
                conn.settimeout(1.0)
                try:
                    conn.recv(4096)
                except socket.timeout:
                    pass
                conn.sendall(b"\x00\x00\x00\x00\xff\xff\xff\x7f" +
                             b"garbage" * 64)
            except OSError:
                pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.stopping = True
        self.thread.join(5)
        for conn in self.conns:
            conn.close()
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


class GarbageDaemonTest(FaultTestCase):
    ESID = False

    def setUp(self):
        super().setUp()
        self.garbage = GarbageDaemon(self.socket_path)
        self.addCleanup(self.garbage.close)

    def test_garbage_from_the_daemon_gives_passthrough(self):
        self.assertBody("/page", RAW)
        # The module was there, read the garbage and refused it: without it
        # the page would come back raw too.
        self.assertEqual(self.esi_status(1), "passthrough")
        self.assertIn("[error]", self.error_log())
        self.assertIn("esi: malformed welcome from esid", self.error_log())

    def test_page_is_processed_once_a_real_esid_replaces_it(self):
        self.assertBody("/page", RAW)
        self.garbage.close()
        self.start_esid()
        self.poll_until_processed()


if __name__ == "__main__":
    unittest.main()
