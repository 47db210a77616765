"""Includes without alt/onerror are fetched concurrently.

The origin's gate holds fragment requests until 32 are in flight together
(or 20 s pass, after which it lets them through): a sequential connector
would see 1 in flight and fail the assertion, not hang.
"""

import unittest

from harness import EsiTestCase, poll

N = 32


class ParallelTest(EsiTestCase):

    def test_32_includes_are_in_flight_at_once(self):
        self.origin.gate("/esi/gate/", N)
        self.origin.prefix("/esi/gate/",
                           lambda target: "<%s>" % target.rsplit("/", 1)[1])
        self.origin.route("/page", "".join(
            '%d:<esi:include src="/esi/gate/%d"/>;' % (i, i)
            for i in range(N)))
        expected = "".join("%d:<%d>;" % (i, i) for i in range(N))
        self.assertBody("/page", expected.encode())
        self.assertEqual(self.origin.max_in_flight("/esi/gate/"), N)

    def test_includes_with_alt_keep_document_order(self):
        # Includes carrying alt= may be resolved one by one (the seed);
        # either way each result lands in its own place.
        self.origin.prefix("/esi/ok/", lambda target: target[-1])
        self.origin.prefix("/esi/alt/", lambda target: target[-1].upper())
        self.origin.route("/page", "".join(
            '<esi:include src="/esi/%s/%s" alt="/esi/alt/%s"/>' % (
                "ok" if i % 2 else "missing", c, c)
            for i, c in enumerate("abcd")))
        self.assertBody("/page", b"AbCd")


# Requests the test may make before both workers have served one (each
# on a new connection, which reuseport hands to a worker by its source
# port): far more than two workers need.
REQUESTS_BOUND = 200


class TwoWorkersTest(EsiTestCase):
    """Two workers, each with its own connection to esid.  `reuseport`
    gives each worker a listening socket of its own, so that connections
    are spread between them (with one shared socket the same idle worker
    tends to take them all); X-Worker-Pid names the one that served."""

    WORKERS = 2
    LISTEN = " reuseport"
    LOCATION = "add_header X-Worker-Pid $pid;"

    def test_pages_are_processed_by_both_workers(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.start()
        workers = poll(lambda: (lambda w: w if len(w) == 2 else None)(
            self.worker_pids()))
        self.assertEqual(len(workers or []), 2, self.worker_pids())
        served = set()
        for n in range(1, REQUESTS_BOUND + 1):
            _, headers, body = self.get("/page")
            self.assertEqual(body, b"aXc", "request %d" % n)
            served.add(int(headers.get("X-Worker-Pid", "0")))
            if served >= set(workers):
                break
        self.assertEqual(served, set(workers),
                         "after %d requests" % REQUESTS_BOUND)
        self.assertEqual(self.esi_status(n), "processed")

    def test_parallel_includes_with_two_workers(self):
        self.origin.gate("/esi/gate/", 8)
        self.origin.prefix("/esi/gate/", "g")
        self.origin.route("/page", "".join(
            '%d<esi:include src="/esi/gate/%d"/>' % (i, i) for i in range(8)))
        self.assertBody("/page", b"0g1g2g3g4g5g6g7g")
        self.assertEqual(self.origin.max_in_flight("/esi/gate/"), 8)


if __name__ == "__main__":
    unittest.main()
