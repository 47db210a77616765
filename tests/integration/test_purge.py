"""Cache purge: esi_cache_purge in the cached location (PURGE method) and in
a location of its own; every Vary variant of a key, wildcard keys, tags
(Surrogate-Key and xkey), 403 outside "from", 503 without esid, and the
keys_zone left as a purge must leave it (no stale HIT, next request a MISS
then a HIT).  esid finds the files; the worker marks and unlinks them."""

import concurrent.futures
import json
import os
import signal
import threading
import unittest

from harness import EsiTestCase, add_http2_variants, poll

VARY = [("Vary", "X-Variant")]

# The harness's "location /" caches in zone "pages" under @@TMP@@/cache.
SAME_LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1 ::1;
"""

SEPARATE_LOCATION = """
        location ~ ^/purge(/.*)$ {
            allow 127.0.0.1;
            deny all;
            esi_cache_purge zone=pages key=$1$is_args$args;
        }
"""


def cached_location(prefix, zone):
    """A location caching in `zone` without ESI, purged by PURGE."""
    return """
        location %s {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache %s;
            proxy_cache_valid 200 10m;
            proxy_cache_key $uri$is_args$args;
            add_header X-Cache-Status $upstream_cache_status;
            esi_cache_purge PURGE from 127.0.0.1;
        }
""" % (prefix, zone)


class PurgeTestCase(EsiTestCase):
    LOCATION = SAME_LOCATION

    def cache_files(self):
        """Cache files on disk (32 hex digits), sorted."""
        found = []
        for root, _, names in os.walk(os.path.join(self.tmp, "cache")):
            found += [os.path.join(root, n) for n in names
                      if len(n) == 32 and all(c in "0123456789abcdef"
                                              for c in n)]
        return sorted(found)

    def cache_status(self, path, variant=None):
        headers = {"X-Variant": variant} if variant else {}
        status, headers, _ = self.get(path, headers)
        self.assertEqual(status, 200, "GET %s" % path)
        return headers.get("X-Cache-Status")

    def purge(self, path, headers=None, method="PURGE"):
        r = self.fetch(path, headers, method=method)
        self.assertTrue(r.complete, "%s %s: %r" % (method, path, r))
        return r

    def assertPurged(self, r, status, result):
        self.assertEqual(r.status, status, r.body)
        self.assertEqual(r.header("Cache-Purge-Result"), result, r.body)
        self.assertEqual(r.header("Content-Type"), "text/html")

    def store_two_variants(self, path="/v"):
        self.origin.route(path, "variant body", headers=VARY)
        self.assertEqual(self.cache_status(path, "a"), "MISS")
        self.assertEqual(self.cache_status(path, "b"), "MISS")
        self.assertEqual(self.cache_status(path, "a"), "HIT")
        self.assertEqual(self.cache_status(path, "b"), "HIT")
        self.assertEqual(len(self.cache_files()), 2)


class SameLocationTest(PurgeTestCase):

    def test_purge_removes_every_vary_variant(self):
        self.store_two_variants()
        r = self.purge("/v")
        self.assertPurged(r, 200, "exact; count=2")
        self.assertIn(b"Successful purge", r.body)
        self.assertIn(b"/v", r.body)
        self.assertEqual(self.cache_files(), [])

    def test_next_requests_are_misses_for_every_variant(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(self.cache_status("/v", "a"), "MISS")
        self.assertEqual(self.cache_status("/v", "b"), "MISS")
        self.assertEqual(self.origin.hits("/v"), 4)

    def test_second_purge_finds_nothing(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        r = self.purge("/v")
        self.assertPurged(r, 404, "exact; count=0")
        self.assertIn(b"Not cached", r.body)

    def test_purge_of_a_key_never_cached_is_404(self):
        self.assertPurged(self.purge("/never"), 404, "exact; count=0")

    def test_purge_leaves_other_keys(self):
        self.store_two_variants("/v")
        self.origin.route("/other", "other")
        self.assertEqual(self.cache_status("/other"), "MISS")
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/other"), "HIT")

    def test_key_includes_the_query(self):
        self.origin.route("/q", "q")
        self.assertEqual(self.cache_status("/q?x=1"), "MISS")
        self.assertEqual(self.cache_status("/q?x=2"), "MISS")
        self.assertPurged(self.purge("/q?x=1"), 200, "exact; count=1")
        self.assertEqual(self.cache_status("/q?x=2"), "HIT")
        self.assertEqual(self.cache_status("/q?x=1"), "MISS")

    def test_keys_zone_stays_consistent_miss_then_hit(self):
        self.origin.route("/k", "k")
        self.assertEqual(self.cache_status("/k"), "MISS")
        self.assertEqual(self.cache_status("/k"), "HIT")
        self.assertPurged(self.purge("/k"), 200, "exact; count=1")
        self.assertEqual(self.cache_status("/k"), "MISS")
        self.assertEqual(self.cache_status("/k"), "HIT")
        self.assertPurged(self.purge("/k"), 200, "exact; count=1")
        self.assertPurged(self.purge("/k"), 404, "exact; count=0")
        self.assertEqual(self.origin.hits("/k"), 2)

    def test_esictl_zones_shows_the_zone_esid_indexes(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        r = self.esictl("zones", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        zone = json.loads(r.stdout)["pages"]
        self.assertEqual(os.path.realpath(zone["path"]),
                         os.path.realpath(os.path.join(self.tmp, "cache")))
        self.assertGreaterEqual(zone["scans"], 1)
        self.assertGreaterEqual(zone["purges"], 1)
        r = self.esictl("zones")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b"pages ", r.stdout)

    def test_esictl_variants_lists_what_a_purge_would_remove(self):
        self.store_two_variants()
        # The first purge reads the zone; its variants are indexed after it.
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.store_two_variants()
        on_disk = sorted(os.path.basename(f) for f in self.cache_files())

        def indexed():
            # Reports travel the ring, esictl the socket: wait for them.
            r = self.esictl("variants", "pages", "/v", "--json")
            self.assertEqual(r.returncode, 0, r.stderr.decode())
            answer = json.loads(r.stdout)
            return answer if sorted(answer["files"]) == on_disk else None

        answer = poll(indexed)
        self.assertIsNotNone(answer, "index never listed %s" % on_disk)
        self.assertTrue(answer["known"])
        r = self.esictl("variants", "nosuchzone", "/v")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"no zone", r.stderr)

    def test_other_methods_still_reach_the_origin(self):
        self.origin.route("/g", "g")
        self.assertEqual(self.cache_status("/g"), "MISS")
        self.assertEqual(self.cache_status("/g"), "HIT")
        files = self.cache_files()
        self.assertEqual(len(files), 1)
        methods = ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
        for method in methods:
            r = self.fetch("/g", method=method)
            self.assertEqual((r.status, r.body, r.complete), (200, b"g", True),
                             method)
        self.assertEqual([m for m, target, _ in self.origin.requests()
                          if target == "/g"], ["GET"] + methods)
        # None of them purged: the object is still there, and hit.
        self.assertEqual(self.cache_files(), files)
        self.assertEqual(self.cache_status("/g"), "HIT")


class RealVaryHeadersTest(PurgeTestCase):
    """The issue's origin: Vary on Accept-Encoding, and on Accept-Encoding
    and Accept-Language; NGINX stores a variant per distinct value set."""

    ENCODINGS = ("gzip", "identity", "br")
    LANGUAGES = ("en", "de")

    def get_variant(self, path, encoding, language=None):
        headers = {"Accept-Encoding": encoding}
        if language:
            headers["Accept-Language"] = language
        status, headers, _ = self.get(path, headers)
        self.assertEqual(status, 200)
        return headers.get("X-Cache-Status")

    def test_every_encoding_and_language_variant_is_purged(self):
        self.origin.route("/ae", "ae", headers=[("Vary", "Accept-Encoding")])
        self.origin.route("/ael", "ael", headers=[
            ("Vary", "Accept-Encoding, Accept-Language")])
        for e in self.ENCODINGS:
            self.assertEqual(self.get_variant("/ae", e), "MISS")
            for lang in self.LANGUAGES:
                self.assertEqual(self.get_variant("/ael", e, lang), "MISS")
        self.assertEqual(len(self.cache_files()), 3 + 6)
        self.assertPurged(self.purge("/ael"), 200, "exact; count=6")
        self.assertPurged(self.purge("/ae"), 200, "exact; count=3")
        self.assertEqual(self.cache_files(), [])
        for e in self.ENCODINGS:
            self.assertEqual(self.get_variant("/ae", e), "MISS")
            for lang in self.LANGUAGES:
                self.assertEqual(self.get_variant("/ael", e, lang), "MISS")


class SeparateLocationTest(PurgeTestCase):
    LOCATION = """
            proxy_cache_key $uri$is_args$args;
"""
    LOCATIONS = SEPARATE_LOCATION

    def test_purge_removes_every_vary_variant(self):
        self.store_two_variants()
        r = self.purge("/purge/v", method="GET")
        self.assertPurged(r, 200, "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/v", "a"), "MISS")
        self.assertEqual(self.cache_status("/v", "b"), "MISS")

    def test_second_purge_finds_nothing(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/purge/v", method="GET"), 200,
                          "exact; count=2")
        self.assertPurged(self.purge("/purge/v", method="GET"), 404,
                          "exact; count=0")

    def test_wildcard_removes_keys_with_the_prefix_only(self):
        for path in ("/shop/a", "/shop/b", "/blog/c"):
            self.origin.route(path, path)
            self.assertEqual(self.cache_status(path), "MISS")
        r = self.purge("/purge/shop*", method="GET")
        self.assertPurged(r, 200, "wildcard; count=2")
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/blog/c"), "HIT")
        self.assertEqual(self.cache_status("/shop/a"), "MISS")
        self.assertEqual(self.cache_status("/shop/b"), "MISS")


class TagTest(PurgeTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/t/1", "1", headers=VARY + [
            ("Surrogate-Key", "p1 p2")])
        self.origin.route("/t/2", "2", headers=[("Surrogate-Key", "p1"),
                                               ("xkey", "p3")])
        self.origin.route("/t/3", "3", headers=[("xkey", "p3")])

    def store(self):
        self.assertEqual(self.cache_status("/t/1", "a"), "MISS")
        self.assertEqual(self.cache_status("/t/1", "b"), "MISS")
        self.assertEqual(self.cache_status("/t/2"), "MISS")
        self.assertEqual(self.cache_status("/t/3"), "MISS")
        self.assertEqual(len(self.cache_files()), 4)

    def test_tag_purge_removes_every_object_with_the_tag(self):
        self.store()
        r = self.purge("/anything", {"Surrogate-Key": "p1"})
        self.assertPurged(r, 200, "tag; count=3")
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/t/3"), "HIT")
        self.assertEqual(self.cache_status("/t/1", "a"), "MISS")
        self.assertEqual(self.cache_status("/t/1", "b"), "MISS")
        self.assertEqual(self.cache_status("/t/2"), "MISS")

    def test_xkey_is_a_tag_too(self):
        self.store()
        self.assertPurged(self.purge("/t/3", {"Surrogate-Key": "p3"}), 200,
                          "tag; count=2")
        self.assertEqual(len(self.cache_files()), 2)

    def test_counts_of_several_tags_add_up(self):
        self.store()
        self.assertPurged(self.purge("/t/1", {"Surrogate-Key": "p2 p3"}),
                          200, "tag; count=4")
        self.assertEqual(self.cache_files(), [])

    def test_esictl_purge_by_tag_removes_it_across_keys(self):
        self.store()
        r = self.esictl("purge", "pages", "p1", "--tag", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(json.loads(r.stdout)["count"], 3)
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/t/2"), "MISS")
        self.assertEqual(self.cache_status("/t/3"), "HIT")

    def test_a_tag_no_object_carries_is_a_purge_of_nothing_200(self):
        # as Varnish's xkey answers; Drupal retries an invalidation that
        # got a 4xx for ever
        self.store()
        self.assertPurged(self.purge("/t/1", {"Surrogate-Key": "nope"}),
                          200, "tag; count=0")
        self.assertEqual(len(self.cache_files()), 4)


class ForbiddenTest(PurgeTestCase):
    LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 10.255.255.1;
"""

    def test_client_outside_from_gets_403_and_nothing_is_purged(self):
        self.origin.route("/f", "f")
        self.assertEqual(self.cache_status("/f"), "MISS")
        r = self.purge("/f")
        self.assertEqual(r.status, 403)
        self.assertIsNone(r.header("Cache-Purge-Result"))
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/f"), "HIT")


class EsidNotRunningTest(PurgeTestCase):
    ESID = False

    def test_purge_is_503_and_the_worker_serves_on(self):
        self.origin.route("/n", "n")
        self.assertEqual(self.cache_status("/n"), "MISS")
        pids = self.worker_pids()
        r = self.purge("/n")
        self.assertEqual(r.status, 503)
        self.assertIn(b"esid is not connected", r.body)
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/n"), "HIT")
        self.assertEqual(self.worker_pids(), pids)


class PurgeTimeoutTest(PurgeTestCase):
    """esi_purge_timeout: a purge esid does not answer in time is a 503
    that removed nothing; the worker drops its connection to esid, serves
    on from the cache, and purges again once esid answers."""
    HTTP = "esi_purge_timeout 300ms;"

    def test_an_unanswered_purge_is_503_and_the_next_one_purges(self):
        self.origin.route("/t", "t")
        self.assertEqual(self.cache_status("/t"), "MISS")
        self.esid.signal(signal.SIGSTOP)
        try:
            r = self.purge("/t")
        finally:
            self.esid.signal(signal.SIGCONT)
        self.assertEqual(r.status, 503, r.body)
        self.assertEqual(self.error_log().count(
            "esid did not answer purge"), 1, self.error_log())
        self.assertEqual(len(self.cache_files()), 1)
        self.assertEqual(self.cache_status("/t"), "HIT")
        answers = []
        self.assertTrue(poll(lambda: answers.append(self.purge("/t")) or
                             answers[-1].status == 200),
                        "no purge succeeded after esid came back: %r\n%s" % (
                            [(a.status, a.body) for a in answers[-3:]],
                            self.error_log()))
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/t"), "MISS")


class EsidRestartTest(PurgeTestCase):

    def attached(self, count):
        return poll(lambda: self.error_log().count(
            "esi: attached to esid") >= count, bound=20.0)

    def test_index_is_rebuilt_from_disk_after_a_restart(self):
        self.store_two_variants()
        self.assertTrue(self.attached(1))
        self.esid.stop()
        self.start_esid()
        self.assertTrue(self.attached(2), "the worker did not attach again")
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/v", "a"), "MISS")
        self.assertEqual(self.cache_status("/v", "b"), "MISS")


class IndexTooSmallTest(PurgeTestCase):
    """An index too small for its zone is safe (purges read the directory)
    and esid says what size would do."""
    HTTP = "esi_purge_index 1k;"

    def test_rebuild_warns_and_purges_still_find_every_variant(self):
        self.store_two_variants()
        for i in range(40):
            self.origin.route("/s%d" % i, "s")
            self.assertEqual(self.cache_status("/s%d" % i), "MISS")
        self.esid.stop()
        self.start_esid()
        self.assertTrue(poll(lambda: "every purge of this zone reads its "
                             "directory" in self.esid.stderr(), bound=20.0))
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertIn('exact purge of "/v": 2 file(s) removed, '
                      'zone directory read', self.error_log())


class IndexOffTest(PurgeTestCase):
    HTTP = "esi_purge_index off;"

    def test_every_purge_reads_the_directory_and_finds_every_variant(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertIn('exact purge of "/v": 2 file(s) removed, '
                      'zone directory read', self.error_log())


class IndexTest(PurgeTestCase):

    def test_purge_after_the_first_scan_uses_the_index(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertIn('exact purge of "/v": 2 file(s) removed, '
                      'via variant index', self.error_log())


class TwoWorkersTest(PurgeTestCase):
    WORKERS = 2

    def test_variants_stored_by_any_worker_are_all_purged(self):
        self.start()
        self.assertTrue(poll(lambda: self.error_log().count(
            "esi: attached to esid") >= 2, bound=20.0))
        self.store_two_variants()
        self.origin.route("/w", "w", headers=VARY)
        for variant in ("a", "b", "c", "d"):
            self.assertEqual(self.cache_status("/w", variant), "MISS")

        # A MISS's answer goes out before its worker renames the file into
        # place and reports it; the purge may come to the other worker.
        def indexed():
            r = self.esictl("variants", "pages", "/w", "--json")
            self.assertEqual(r.returncode, 0, r.stderr.decode())
            return len(json.loads(r.stdout)["files"]) == 4

        self.assertTrue(poll(lambda: len(self.cache_files()) == 6))
        self.assertTrue(poll(indexed), "index never listed 4 files of /w")
        self.assertPurged(self.purge("/w"), 200, "exact; count=4")
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(self.cache_files(), [])


class RingFullTest(PurgeTestCase):
    """Reports that find the ring full wait in order, ahead of the purge."""
    ESID_ARGS = ("--log-level", "debug", "--ring-size", str(256 * 1024))
    LOCATIONS = cached_location("/nc/", "pages")
    COUNT = 400  # reports of about 1 KB each: more than the ring holds

    def test_every_report_reaches_esid_after_it_stalls(self):
        self.origin.prefix("/nc/", "nc")
        self.start()
        self.assertTrue(poll(lambda: "files indexed" in self.esid.stderr(),
                             bound=20.0))
        pad = "x" * 1000
        self.esid.signal(signal.SIGSTOP)
        try:
            for i in range(self.COUNT):
                self.assertEqual(self.cache_status(
                    "/nc/%d?pad=%s" % (i, pad)), "MISS")
        finally:
            self.esid.signal(signal.SIGCONT)
        # nginx renames the last file into place after the response went out
        self.assertTrue(poll(lambda: len(self.cache_files()) == self.COUNT))
        self.assertPurged(self.purge("/nc/*"), 200,
                          "wildcard; count=%d" % self.COUNT)
        self.assertEqual(self.cache_files(), [])
        self.assertIn("via variant index", self.error_log())


class EsictlPurgeTest(PurgeTestCase):
    """esictl purge: esid relays the order to a worker, which purges as an
    HTTP purge would (keys_zone marked, files unlinked)."""
    WORKERS = 2

    def test_purge_removes_every_vary_variant_and_the_next_request_misses(
            self):
        self.store_two_variants()
        r = self.esictl("purge", "pages", "/v")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b'exact purge of "/v" in pages: 2 file(s) removed',
                      r.stdout)
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/v", "a"), "MISS")
        self.assertEqual(self.cache_status("/v", "b"), "MISS")
        self.assertIn('esi: esid relays purge order', self.error_log())

    def test_json_answer_says_what_was_done(self):
        self.store_two_variants()
        r = self.esictl("purge", "pages", "/v", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        answer = json.loads(r.stdout)
        self.assertEqual((answer["zone"], answer["kind"], answer["value"],
                          answer["count"]), ("pages", "key", "/v", 2))
        r = self.esictl("purge", "pages", "/v", "--json")
        self.assertEqual(json.loads(r.stdout)["count"], 0)

    def test_prefix_removes_keys_with_the_prefix_only(self):
        for path in ("/p/1", "/p/2", "/q"):
            self.origin.route(path, path)
            self.assertEqual(self.cache_status(path), "MISS")
        r = self.esictl("purge", "pages", "/p/", "--prefix")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b"2 file(s) removed", r.stdout)
        self.assertEqual(self.cache_status("/q"), "HIT")
        self.assertEqual(self.cache_status("/p/1"), "MISS")

    def test_unknown_zone_is_an_error(self):
        self.start()
        r = self.esictl("purge", "nosuchzone", "/v")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b'no connected NGINX worker serves zone "nosuchzone"',
                      r.stderr)


class EsictlPurgeWithoutWorkersTest(PurgeTestCase):

    def test_purge_without_nginx_is_an_error_not_a_hang(self):
        self.start_esid()
        r = self.esictl("purge", "pages", "/v")
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"no connected NGINX worker", r.stderr)


class WorkerServesDuringPurgeTest(PurgeTestCase):
    """A purge waiting for esid (stopped here, as if scanning a huge zone)
    leaves its worker free: other requests on the only worker are served
    meanwhile, and the purge completes once esid answers."""
    SERVER = """
        location = /status {
            stub_status;
        }
"""

    def requests_in_progress(self):
        status, _, body = self.get("/status")
        self.assertEqual(status, 200)
        # "Reading: 0 Writing: 2 Waiting: 0": the status request is one
        return int(body.split(b"Writing: ")[1].split()[0]) - 1

    def test_requests_are_served_while_a_purge_waits(self):
        self.store_two_variants()
        self.origin.route("/other", "other", content_type="text/plain")
        self.assertEqual(self.cache_status("/other"), "MISS")
        self.esid.signal(signal.SIGSTOP)
        result = {}
        purge = threading.Thread(
            target=lambda: result.update(r=self.purge("/v")))
        try:
            purge.start()
            self.assertTrue(poll(lambda: self.requests_in_progress() == 1),
                            "the purge never reached the worker")
            for _ in range(20):
                self.assertEqual(self.cache_status("/other"), "HIT")
            self.assertTrue(purge.is_alive(),
                            "the purge finished while esid was stopped")
            self.assertEqual(self.requests_in_progress(), 1)
        finally:
            self.esid.signal(signal.SIGCONT)
            purge.join()
        self.assertPurged(result["r"], 200, "exact; count=2")


class ConcurrentPurgeTest(PurgeTestCase):
    """Purges and requests of the same key at once, on two workers: every
    request answers, the keys_zone stays consistent (a final purge leaves
    no file and the next request is a MISS, then a HIT)."""
    WORKERS = 2

    def test_purges_and_requests_of_one_key_interleave_safely(self):
        variants = {"v%d" % i: "variant %d" % i for i in range(3)}
        self.origin.route("/c", variants, headers=VARY, by_header="X-Variant")

        def requests():
            for i in range(60):
                variant = "v%d" % (i % 3)
                self.assertBody("/c", variants[variant].encode(),
                                headers={"X-Variant": variant})

        def purges():
            for _ in range(30):
                r = self.purge("/c")
                self.assertIn(r.status, (200, 404))
                self.assertRegex(r.header("Cache-Purge-Result"),
                                 r"^exact; count=\d$")

        self.start()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            runs = [pool.submit(f) for f in (requests, requests, purges,
                                             purges)]
        for run in runs:
            run.result()  # raises what the thread's assertion raised

        # nginx renames a file into place just after its response went out:
        # purge until a purge finds nothing left, which an inconsistent
        # keys_zone or index would never let happen
        def purged_all():
            return self.purge("/c").status == 404 and not self.cache_files()

        self.assertTrue(poll(purged_all))
        self.assertEqual(self.cache_status("/c", "v0"), "MISS")
        self.assertEqual(self.cache_status("/c", "v0"), "HIT")
        self.assertNotIn("[alert]", self.error_log())
        self.assertNotIn("[crit]", self.error_log())


class TooManyVariantsTest(PurgeTestCase):
    """An index entry over 64 variants is dropped: that key's next purge
    reads the directory, and still finds every variant."""

    def indexed(self):
        return poll(lambda: "files indexed" in self.esid.stderr(), bound=20.0)

    def store_variants(self, path, count):
        self.origin.route(path, "many", headers=VARY)
        for i in range(count):
            self.assertEqual(self.cache_status(path, "v%d" % i), "MISS")

    def test_64_variants_stay_indexed(self):
        self.start()
        self.assertTrue(self.indexed())
        self.store_variants("/m", 64)
        self.assertPurged(self.purge("/m"), 200, "exact; count=64")
        self.assertIn('exact purge of "/m": 64 file(s) removed, '
                      'via variant index', self.error_log())

    def test_65th_variant_drops_the_entry_and_the_purge_scans(self):
        self.start()
        self.assertTrue(self.indexed())
        self.store_variants("/m", 65)
        self.assertPurged(self.purge("/m"), 200, "exact; count=65")
        self.assertIn('exact purge of "/m": 65 file(s) removed, '
                      'zone directory read', self.error_log())
        self.assertEqual(self.cache_files(), [])


class EvictedUnderTheIndexTest(PurgeTestCase):
    """NGINX's cache manager removes inactive files without telling esid;
    a purge of the key then names files that are gone: skipped, 404."""
    HTTP = "proxy_cache_path @@TMP@@/short keys_zone=short:1m inactive=1s;"
    LOCATIONS = cached_location("/s/", "short")

    def short_files(self):
        root = os.path.join(self.tmp, "short")
        return [n for _, _, names in os.walk(root) for n in names]

    def test_purge_of_evicted_files_is_harmless(self):
        self.origin.route("/s/e", "e", headers=VARY)
        self.start()
        self.assertTrue(poll(lambda: self.esid.stderr().count(
            "files indexed") >= 2, bound=20.0))
        self.assertEqual(self.cache_status("/s/e", "a"), "MISS")
        self.assertEqual(self.cache_status("/s/e", "b"), "MISS")
        self.assertTrue(poll(lambda: len(self.short_files()) == 2))
        r = self.esictl("variants", "short", "/s/e", "--json")
        self.assertEqual(len(json.loads(r.stdout)["files"]), 2)
        self.assertTrue(poll(lambda: self.short_files() == [], bound=30.0),
                        "the cache manager did not evict")
        pids = self.worker_pids()
        self.assertPurged(self.purge("/s/e"), 404, "exact; count=0")
        self.assertEqual(self.worker_pids(), pids)
        self.assertNotIn("[crit]", self.error_log())
        self.assertEqual(self.cache_status("/s/e", "a"), "MISS")


class RebuildThenIndexedTest(PurgeTestCase):
    """After an esid restart, once the rebuild finished, even the first
    purge is answered by the index: with two workers, neither worker's
    re-announcement puts the zone in doubt, since neither lost a report."""
    WORKERS = 2

    def attached(self, count):
        return poll(lambda: self.error_log().count(
            "esi: attached to esid") >= count, bound=20.0)

    def zone(self):
        r = self.esictl("zones", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return json.loads(r.stdout).get("pages")

    def rebuilt(self):
        zone = self.zone()
        return zone and zone["complete"] and not zone["scanning"]

    def test_first_purge_after_the_rebuild_uses_the_index(self):
        self.start()
        self.assertTrue(self.attached(2))
        self.store_two_variants()
        self.esid.stop()
        self.start_esid()
        self.assertTrue(self.attached(4), "the workers did not attach again")
        self.assertTrue(poll(self.rebuilt, bound=20.0))
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertIn('exact purge of "/v": 2 file(s) removed, '
                      'via variant index', self.error_log())

    def test_a_file_stored_while_esid_was_away_is_purged_too(self):
        self.start()
        self.assertTrue(self.attached(2))
        self.store_two_variants()
        self.esid.stop()
        self.assertEqual(self.cache_status("/v", "c"), "MISS")
        self.assertTrue(poll(lambda: len(self.cache_files()) == 3))
        self.start_esid()
        self.assertTrue(self.attached(4), "the workers did not attach again")
        self.assertPurged(self.purge("/v"), 200, "exact; count=3")
        self.assertEqual(self.cache_files(), [])


add_http2_variants(globals())

if __name__ == "__main__":
    unittest.main()
