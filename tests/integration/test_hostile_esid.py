"""A hostile esid: tests/hostile/hostile_esid speaks the real protocol (the
Hello, a Welcome with the memfd and eventfds, the rings, Cap'n Proto
records) and then breaks it one way per test.  Two nginx workers must refuse
each violation, name it in the error log, drop the connection and apply
esi_fallback: with the default passthrough every client gets the page
unprocessed and whole, in sequential requests and in a short wrk run, with
no socket error or timeout and no worker lost (the harness also fails a test
whose error.log shows a worker exiting on a signal or an [alert]).

The double's honest mode answers every body with a verbatim of itself: the
page comes back unchanged but processed, which shows that the double's
handshake and framing are right and the refusals are for the violations.
"""

import os
import re
import unittest

from harness import BUILD_DIR, DidNotStart, EsiTestCase, start_on_socket
from test_faults_load import Page, WrkChecks
from test_stitch import gunzip

HOSTILE = os.path.join(BUILD_DIR, "hostile_esid")


# A test that needs the double's answer (a processed page) gives it this
# long: a hang guard, below wrk's --timeout, not a pace.  A violation gives
# the unprocessed page whether it comes in time or not, so those tests keep
# the 300 ms, which the silent double needs to be given up on.
ANSWER_TIMEOUT = "esi_daemon_timeout 5s;"


class HostileTestCase(WrkChecks, EsiTestCase):
    """nginx pointed at hostile_esid --mode MODE instead of esid."""

    ESID = False
    WORKERS = 2
    HTTP = "esi_daemon_timeout 300ms;"
    MODE = "verbatim"
    AFTER = 0
    # Several body messages (esi_buffer_size is 16k) and two includes.
    PAGE = Page.build("/page", includes=2, text_bytes=20000)

    def setUp(self):
        super().setUp()
        if not os.path.exists(HOSTILE):
            self.fail("hostile_esid not found at %s: build the project first"
                      % HOSTILE)
        self.PAGE.serve(self.origin)
        try:
            self.hostile = start_on_socket(self.spawn, "hostile", [
                HOSTILE, "--socket", self.socket_path, "--mode", self.MODE,
                "--after", str(self.AFTER)], self.socket_path)
        except DidNotStart as e:
            self.fail("hostile_esid did not come up:\n%s" % e.log)

    def violations(self):
        return self.hostile.stderr().count("hostile: %s " % self.MODE)


class ViolationChecks:
    """Every page falls back to passthrough, the error log names what the
    worker refused, and both workers live on."""

    # The module's error.log line for the violation.
    REFUSAL = None

    def test_every_response_is_the_unprocessed_page(self):
        workers = self.running_workers()
        for n in range(1, 4):
            self.assertBody(self.PAGE.path, self.PAGE.raw)
            self.assertEqual(self.esi_status(n), "passthrough")
        tallies = self.wrk(self.PAGE.path, [self.PAGE.raw], seconds=2,
                           connections=4)
        self.assertAllAllowed(tallies)
        self.assertTrue(re.search(self.REFUSAL, self.error_log()),
                        "error.log does not say %r" % self.REFUSAL)
        self.assertEqual(self.worker_pids(), workers)
        self.report("%s after %d" % (self.MODE, self.AFTER),
                    requests=3 + tallies["requests"],
                    violations=self.violations(),
                    refusals=len(re.findall(self.REFUSAL, self.error_log())))


class HonestDoubleTest(HostileTestCase):
    HTTP = ANSWER_TIMEOUT

    def test_pages_are_processed_and_come_back_unchanged(self):
        workers = self.running_workers()
        for n in range(1, 4):
            self.assertBody(self.PAGE.path, self.PAGE.raw)
            self.assertEqual(self.esi_status(n), "processed")
        tallies = self.wrk(self.PAGE.path, [self.PAGE.raw], seconds=2,
                           connections=4)
        self.assertAllAllowed(tallies)
        self.assertNotIn("[error]", self.error_log())
        self.assertEqual(self.worker_pids(), workers)


class OffsetOutOfRangeTest(ViolationChecks, HostileTestCase):
    MODE = "offset-out-of-range"
    REFUSAL = r"esi: verbatim \d+\+1 of stream \d+ is outside"


class OffsetOutOfRangeMidStreamTest(ViolationChecks, HostileTestCase):
    """The first answer of each connection is honest: the violation comes
    while the page is half sent."""
    MODE = "offset-out-of-range"
    AFTER = 1
    REFUSAL = r"esi: verbatim \d+\+1 of stream \d+ is outside"


class OversizedLengthTest(ViolationChecks, HostileTestCase):
    MODE = "oversized-length"
    REFUSAL = r"esi: verbatim \d+\+4294967295 of stream \d+ is outside"


class UnknownStreamTest(ViolationChecks, HostileTestCase):
    MODE = "unknown-stream"
    REFUSAL = r"esi: response for stream 2147483647 never opened"


class TruncatedCapnpTest(ViolationChecks, HostileTestCase):
    MODE = "truncated-capnp"
    REFUSAL = r"esi: malformed response from esid"


class ShrunkenMemfdTest(ViolationChecks, HostileTestCase):
    MODE = "shrunken-memfd"
    REFUSAL = r"esi: the shared memory from esid has the wrong size"


class UnsealedMemfdTest(ViolationChecks, HostileTestCase):
    MODE = "unsealed-memfd"
    REFUSAL = r"esi: the shared memory from esid is not sealed"


class WritableArenaTest(ViolationChecks, HostileTestCase):
    MODE = "writable-arena"
    REFUSAL = r"esi: the segment arena from esid is not sealed"


class GarbageRingTest(ViolationChecks, HostileTestCase):
    MODE = "garbage-ring"
    REFUSAL = r"esi: the ring from esid is corrupt"


class SilentDaemonTest(ViolationChecks, HostileTestCase):
    MODE = "silent"
    REFUSAL = r"esi: esid did not answer stream \d+ in time"


class OddForgetTest(ViolationChecks, HostileTestCase):
    """A forget whose file names are not 16 bytes each: the worker refuses
    it and drops the connection, forgetting nothing on its word."""
    MODE = "odd-forget"
    REFUSAL = r"esi: malformed forget from esid"


class InjectingIncludeTest(ViolationChecks, HostileTestCase):
    """An include whose args would end the request line upstream and add a
    header: refused before any subrequest is made."""
    MODE = "injecting-include"
    REFUSAL = r"esi: malformed include path from esid"

    def test_the_origin_never_sees_the_include(self):
        self.assertBody(self.PAGE.path, self.PAGE.raw)
        self.assertIn("esi: malformed include path from esid",
                      self.error_log())
        self.assertEqual(self.origin.hits_under("/injected"), 0)
        for _, target, headers in self.origin.requests():
            self.assertEqual(target, self.PAGE.path)
            self.assertNotIn("x-injected", [h.lower() for h in headers])


class TryDoubleTest(HostileTestCase):
    """Each answer's verbatim inside a try whose attempt succeeds: held,
    then emitted; the except part's literal never."""
    MODE = "try"
    HTTP = ANSWER_TIMEOUT

    def test_pages_come_back_unchanged_through_the_attempt(self):
        for n in range(1, 4):
            self.assertBody(self.PAGE.path, self.PAGE.raw)
            self.assertEqual(self.esi_status(n), "processed")
        tallies = self.wrk(self.PAGE.path, [self.PAGE.raw], seconds=2,
                           connections=4)
        self.assertAllAllowed(tallies)
        self.assertNotIn("[error]", self.error_log())


class TryExceptOutsideTest(ViolationChecks, HostileTestCase):
    MODE = "try-except-outside"
    REFUSAL = r"esi: tryExcept outside an attempt in stream \d+ from esid"


class TryEndEarlyTest(ViolationChecks, HostileTestCase):
    MODE = "try-end-early"
    REFUSAL = r"esi: tryEnd without its tryExcept in stream \d+ from esid"


class LastInsideTryTest(ViolationChecks, HostileTestCase):
    MODE = "last-inside-try"
    REFUSAL = r"esi: esid ended stream \d+ inside a try"

    def test_every_response_is_the_unprocessed_page(self):
        # the try opens on the last answer only: what went before is
        # processed (and equal to the page), the rest passes through
        workers = self.running_workers()
        for n in range(1, 4):
            self.assertBody(self.PAGE.path, self.PAGE.raw)
        self.assertTrue(re.search(self.REFUSAL, self.error_log()))
        self.assertEqual(self.worker_pids(), workers)


class GiantLiteralTest(ViolationChecks, HostileTestCase):
    """Literals are bytes esid made: esi_max_page_size bounds them too, so
    a lying esid cannot grow a request's pool without end."""
    MODE = "giant-literal"
    LOCATION = "esi_max_page_size 128k;"
    REFUSAL = r"esi: esid made more than esi_max_page_size 131072"


class PlanViolationChecks:
    """A cache hit's plan breaks the protocol (the double answers bodies
    honestly): the miss before it is processed, each hit's plan is refused
    and named in the error log, the hit goes out unprocessed and whole,
    and both workers live on."""

    # The miss must be answered: it is processed, and records the plan.
    HTTP = ANSWER_TIMEOUT + " esi_plan_zone plans:1m;"
    LOCATION = "esi_plan plans;"
    REFUSAL = r"esi: malformed plan from esid for stream \d+"
    HEADERS = {}

    def body(self):
        _, headers, body = self.get(self.PAGE.path, self.HEADERS)
        return headers, body

    def test_each_hits_plan_is_refused(self):
        workers = self.running_workers()
        for n in range(1, 5):
            headers, body = self.body()
            self.assertEqual(headers.get("X-Cache-Status"),
                             "MISS" if n == 1 else "HIT")
            self.assertEqual(body, self.PAGE.raw)
            self.assertEqual(self.esi_status(n),
                             "processed" if n == 1 else "passthrough")
        self.assertGreaterEqual(self.violations(), 3)
        self.assertGreaterEqual(
            len(re.findall(self.REFUSAL, self.error_log())), 3)
        self.assertEqual(self.worker_pids(), workers)


class PlanUncheckedGapTest(PlanViolationChecks, HostileTestCase):
    MODE = "plan-unchecked-gap"


class PlanTryUncheckedTest(PlanViolationChecks, HostileTestCase):
    MODE = "plan-try-unchecked"


class StitchedPlanViolationChecks(PlanViolationChecks):
    """The same for a gzip client under esi_stitch, whose plan may name
    segments: the response stays a whole, valid gzip stream."""

    LOCATION = "esi_plan plans; esi_stitch on;"
    HEADERS = {"Accept-Encoding": "gzip"}

    def body(self):
        headers, body = super().body()
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        return headers, gunzip(body)


class PlanSegmentOutsideArenaTest(StitchedPlanViolationChecks,
                                  HostileTestCase):
    MODE = "plan-segment-outside-arena"


class PlanPinOutOfRangeTest(StitchedPlanViolationChecks, HostileTestCase):
    MODE = "plan-pin-out-of-range"


class ViolationWithFallbackAbortTest(HostileTestCase):
    MODE = "truncated-capnp"
    LOCATION = "esi_fallback abort;"

    def test_client_never_gets_a_page_that_looks_whole(self):
        for n in range(1, 4):
            r = self.fetch(self.PAGE.path)
            self.assertTrue(not r.complete or r.status >= 500, r)
            self.assertNotEqual(r.body, self.PAGE.raw)
            self.assertEqual(self.esi_status(n), "aborted")
        self.assertIn("esi: malformed response from esid", self.error_log())


if __name__ == "__main__":
    unittest.main()
