"""Faults under load: bounded wrk runs on 127.0.0.1 against an ESI page with
includes, two nginx workers, while esid is SIGKILLed and restarted over and
over, SIGSTOPped past esi_daemon_timeout, or given rings so small that they
are full all the time.

wrk's counts are not trusted alone: check_bodies.lua compares every body
with the bodies a client may get (the assembled page, or with the default
esi_fallback passthrough the page assembled up to where esid failed and
passed through unprocessed from there).  Every run must end with zero
socket errors and timeouts, every body allowed, and the workers alive (the
harness also fails a test whose error.log shows a worker exiting on a
signal or an [alert]).  Nothing asserts on time: faults are paced by what
esid has done (its stream counter) and by what the error log says, and a
run lasts until its faults are done (then wrk is interrupted), not for a
fixed time in which a slow machine might do fewer.
"""

import os
import shutil
import signal
import sys
import time
import unittest

from harness import EsiTestCase, _read, poll

WRK = shutil.which("wrk") or "/usr/bin/wrk"
CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "check_bodies.lua")
# Hang guards: a request slower than this counts as a wrk timeout, which
# fails the test; a wrk run may take this much longer than asked for.
WRK_TIMEOUT = 10
WRK_GRACE = 30.0
# Streams a fresh (or resumed) esid serves before the next fault.
STREAMS_BEFORE_FAULT = 20
# A run that injects faults lasts until they are done; this bounds it (a
# hang guard: wrk is interrupted as soon as the faults are done).
FAULT_RUN_BOUND = 120
# Faults each such run injects.
KILLS = 3
STOPS_GIVEN_UP = 2
# Times the workers waited for room in their rings to esid (esid's
# worker_waits) during the full-ring run.
RING_WAITS = 20

# The module's error.log lines this file waits for.
ATTACHED = "esi: attached to esid"
GAVE_UP = "did not answer stream"


class Page:
    """An ESI page: texts around includes of plain fragments.

    A client gets the assembled page, or, when esid fails mid-stream under
    esi_fallback passthrough, the page assembled up to some point and the
    raw page from there: since a cut inside a text gives the same bytes as a
    cut at its start, the allowed bodies are "assembled up to include j,
    raw from text j on" for each j, the raw page (j = 0) and the assembled
    page (j = n) included."""

    def __init__(self, path, texts, fragments):
        assert len(texts) == len(fragments) + 1
        self.path = path
        self.texts = [t.encode() for t in texts]
        self.fragments = [(src, body.encode()) for src, body in fragments]
        self.tags = [b'<esi:include src="%s"/>' % src.encode()
                     for src, _ in fragments]

    @classmethod
    def build(cls, path, includes, text_bytes):
        """`includes` fragments under /esi/, texts of about `text_bytes`
        each, every line numbered so that no two cuts look alike."""
        texts = []
        for i in range(includes + 1):
            line = "<p>text %d line %%d</p>\n" % i
            text, n = "", 0
            while len(text) < text_bytes:
                text += line % n
                n += 1
            texts.append(text)
        fragments = [("/esi/f%d" % i, "<b>fragment %d</b>" % i)
                     for i in range(1, includes + 1)]
        return cls(path, texts, fragments)

    def serve(self, origin):
        origin.route(self.path, self.raw)
        for src, body in self.fragments:
            origin.route(src, body)

    def assembled_up_to(self, j):
        out = [self.texts[0]]
        for i in range(len(self.tags)):
            out.append(self.fragments[i][1] if i < j else self.tags[i])
            out.append(self.texts[i + 1])
        return b"".join(out)

    @property
    def raw(self):
        return self.assembled_up_to(0)

    @property
    def processed(self):
        return self.assembled_up_to(len(self.tags))

    def allowed(self):
        return [self.assembled_up_to(j) for j in range(len(self.tags) + 1)]


class WrkChecks:
    """Checked wrk runs for an EsiTestCase."""

    def wrk(self, path, allowed, seconds=3, connections=8, during=None):
        """wrk on `path` for `seconds`, every response checked against the
        `allowed` bodies.  `during(wrk)`, when given, is called over and
        over while wrk runs (it injects the faults and must poll, bounded,
        on `wrk.alive()`); once it returns true, wrk is interrupted
        (SIGINT: it stops and reports).  Returns the checker's tallies, a
        dict."""
        self.start()
        runs = getattr(self, "_wrk_runs", 0) + 1
        self._wrk_runs = runs
        out = os.path.join(self.tmp, "wrk-%d" % runs)
        files = []
        for i, body in enumerate(allowed):
            files.append("%s.allowed-%d" % (out, i + 1))
            with open(files[-1], "wb") as f:
                f.write(body)
        wrk = self.spawn("wrk-%d" % runs, [
            WRK, "-t", "2", "-c", str(connections), "-d", "%ds" % seconds,
            "--timeout", "%ds" % WRK_TIMEOUT, "-s", CHECKER,
            "http://%s%s" % (self.host, path), "--", out] + files)
        deadline = time.monotonic() + seconds + WRK_GRACE
        while during is not None and wrk.alive() and \
                time.monotonic() < deadline:
            if during(wrk):
                wrk.signal(signal.SIGINT)
                break
        if not poll(lambda: not wrk.alive(), bound=seconds + WRK_GRACE):
            self.fail("wrk did not finish within %ss" % (seconds + WRK_GRACE))
        tallies = {}
        try:
            with open(out) as f:
                for line in f:
                    name, value = line.split()
                    tallies[name] = int(value)
        except OSError as e:
            self.fail("wrk left no tallies (%s):\n%s" % (e, wrk.stderr()))
        tallies["bad_samples"] = sorted(
            os.path.join(self.tmp, n) for n in os.listdir(self.tmp)
            if n.startswith(os.path.basename(out) + ".bad-"))
        return tallies

    def running_workers(self):
        """Pids of all WORKERS workers, once they all run."""
        self.start()
        workers = poll(lambda: (lambda w: w if len(w) == self.WORKERS
                                else None)(self.worker_pids()))
        if not workers:
            self.fail("not %d workers: %r" % (self.WORKERS,
                                               self.worker_pids()))
        return workers

    def assertAllAllowed(self, tallies):
        """No socket error or timeout, every response a 200 with an allowed
        body, and at least one response."""
        errors = {k: v for k, v in tallies.items()
                  if k.startswith("errors_") and v}
        self.assertEqual(errors, {}, "wrk saw errors: %r" % tallies)
        self.assertGreater(tallies["requests"], 0, tallies)
        samples = []
        for path in tallies["bad_samples"][:3]:
            with open(path, "rb") as f:
                samples.append(f.read(600))
        self.assertEqual(tallies["bad"], 0, "bodies not allowed: %r\n%r" % (
            tallies, samples))
        self.assertEqual(tallies["good"], tallies["requests"], tallies)

    def report(self, what, **figures):
        """One line of figures on stderr, for tests/README.md."""
        sys.stderr.write("\n  %s: %s\n" % (what, ", ".join(
            "%s=%s" % kv for kv in sorted(figures.items()))))


class LoadTestCase(WrkChecks, EsiTestCase):
    WORKERS = 2
    HTTP = "esi_daemon_timeout 300ms;"
    ESID_ARGS = ("--log-level", "info")
    PAGE = Page.build("/page", includes=4, text_bytes=20000)

    def setUp(self):
        super().setUp()
        self.PAGE.serve(self.origin)

    def warm_up(self):
        """The page served assembled once; returns the workers' pids.
        A cold esid on a loaded machine (sanitized, under CI) may miss the
        300 ms timeout on its very first page, which then falls back as it
        may: ask again, a bounded number of times."""
        self.assertTrue(
            poll(lambda: self.get(self.PAGE.path)[2] == self.PAGE.processed,
                 bound=10.0, interval=0.1),
            "the page was never served assembled")
        return self.running_workers()

    def assertRecovers(self):
        """The last esid assembles pages again.  As in warm_up, a fresh
        esid under a sanitizer may miss the 300 ms timeout on its first
        page, and a worker whose reconnect failed while esid was down passes
        pages through until it connects: ask again, a bounded number of
        times."""
        self.assertTrue(
            poll(lambda: self.get(self.PAGE.path)[2] == self.PAGE.processed,
                 bound=10.0, interval=0.1),
            "no page was assembled after the last restart")

    def hits(self, tallies):
        """How many responses were each allowed body, raw page first."""
        return [tallies.get("allowed_%d" % (j + 1), 0)
                for j in range(len(self.PAGE.tags) + 1)]

    def streams_served(self):
        return self.stats_json()["streams"]


class EsidKilledUnderLoadTest(LoadTestCase):

    def test_esid_killed_and_restarted_over_and_over_under_load(self):
        workers = self.warm_up()
        kills = []

        def kill_when_busy(wrk):
            # Each esid serves pages under load before it is killed.
            def busy():
                return self.streams_served() >= STREAMS_BEFORE_FAULT

            poll(lambda: not wrk.alive() or busy(), bound=WRK_GRACE,
                 interval=0.05)
            if wrk.alive() and busy():
                self.esid.kill()
                kills.append(self.esid.pid)
                self.start_esid()
            return len(kills) >= KILLS

        tallies = self.wrk(self.PAGE.path, self.PAGE.allowed(),
                           seconds=FAULT_RUN_BOUND, during=kill_when_busy)
        self.report("SIGKILL under load", kills=len(kills),
                    requests=tallies["requests"], bodies=self.hits(tallies))
        self.assertAllAllowed(tallies)
        self.assertEqual(len(kills), KILLS, "wrk ended before the kills")
        self.assertEqual(self.worker_pids(), workers)
        self.assertRecovers()


class EsidStoppedUnderLoadTest(LoadTestCase):

    def test_esid_stopped_past_the_daemon_timeout_under_load(self):
        workers = self.warm_up()
        stops = []

        def stop_past_timeout(wrk):
            served = self.streams_served()
            poll(lambda: not wrk.alive()
                 or self.streams_served() >= served + STREAMS_BEFORE_FAULT,
                 bound=WRK_GRACE, interval=0.05)
            if not wrk.alive():
                return
            before = self.error_log().count(GAVE_UP)

            def gave_up():
                return self.error_log().count(GAVE_UP) > before

            self.esid.signal(signal.SIGSTOP)
            try:
                # Stopped until a worker has given up on it.
                poll(lambda: gave_up() or not wrk.alive(), bound=WRK_GRACE,
                     interval=0.05)
                stops.append(gave_up())
            finally:
                self.esid.signal(signal.SIGCONT)
            return stops.count(True) >= STOPS_GIVEN_UP

        tallies = self.wrk(self.PAGE.path, self.PAGE.allowed(),
                           seconds=FAULT_RUN_BOUND, during=stop_past_timeout)
        self.report("SIGSTOP under load", stops=len(stops),
                    timed_out=stops.count(True),
                    requests=tallies["requests"], bodies=self.hits(tallies))
        self.assertAllAllowed(tallies)
        self.assertEqual(stops.count(True), STOPS_GIVEN_UP,
                         "wrk ended before workers gave up on a stopped "
                         "esid %d times: %r" % (STOPS_GIVEN_UP, stops))
        self.assertEqual(self.worker_pids(), workers)
        self.assertRecovers()


class FullRingUnderLoadTest(LoadTestCase):
    """esid's smallest ring, 256 KiB a direction, and 1 MB pages: the ring
    to esid is full most of the time, which is back-pressure, not a fault,
    so every page must come back assembled."""

    ESID_ARGS = ("--log-level", "info", "--ring-size", "256K")
    # A stream waiting for ring space waits on esid: a short timeout would
    # turn this test into one of a late esid.
    HTTP = "esi_daemon_timeout 10s;"
    # Every hit's body crosses the ring: a planned hit sends none.
    LOCATION = "esi_plan off;"
    PAGE = Page.build("/big", includes=8, text_bytes=120000)

    def test_a_full_ring_holds_pages_back_and_loses_none(self):
        workers = self.warm_up()
        before = self.stats_json()["worker_waits"]
        log = os.path.join(self.tmp, "access.log")
        logged = len(_read(log).splitlines())

        def waits():
            return self.stats_json()["worker_waits"] - before

        def served():
            return len(_read(log).splitlines()) - logged

        def watch_rings(wrk):
            # esid counts each time a worker found its ring to esid full,
            # waited, and was woken: a counter, which no sampling can miss.
            # And pages came back meanwhile (nginx logs each once sent):
            # stopped before any, wrk would have nothing to check.
            return poll(lambda: not wrk.alive() or (
                waits() >= RING_WAITS and served() >= 32),
                bound=WRK_GRACE, interval=0.05) and wrk.alive()

        tallies = self.wrk(self.PAGE.path, [self.PAGE.processed],
                           seconds=FAULT_RUN_BOUND, connections=16,
                           during=watch_rings)
        stats = self.stats_json()
        self.report("full ring under load", requests=tallies["requests"],
                    worker_waits=waits(), esid_ring_full=stats["ring_full"],
                    page_bytes=len(self.PAGE.raw))
        self.assertAllAllowed(tallies)
        self.assertGreaterEqual(waits(), RING_WAITS,
                                "the ring to esid never filled")
        self.assertEqual(self.worker_pids(), workers)


if __name__ == "__main__":
    unittest.main()
