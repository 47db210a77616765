"""A cached object replaced by another of the same length, Date,
Last-Modified and ETag, stored within the same second (a warmer after a
purge, a proxy_cache_bypass refresh): every later hit carries the new
object's bytes, whatever the worker or esid had learnt of the old one
(its plan, its gzip segments, the worker's copy of the plan, the worker's
note that it had no ESI).

The same second is not left to the clock: once the new object is stored,
its cache file's header gets the old one's seconds (valid_sec, date and
the rest, as NGINX writes them from its clock) and the file the old one's
modification time (two stores within one tick of the kernel's coarse
clock have it), whenever the two stores happened.  The new file then
differs from the old only in its bytes and, where the old one was still
there when it was written (a bypass), its inode; after a purge even the
inode may be the old one's (ext4 reuses it), and only the purge itself
tells the worker and esid that the object changed."""

import hashlib
import json
import os

from harness import EsiTestCase, poll
from test_stitch import GZIP, gunzip, text

VALIDATORS = [("ETag", '"v1"'),
              ("Last-Modified", "Tue, 01 Dec 2026 10:00:00 GMT")]

INCLUDE = '<esi:include src="/esi/a"/>'
# text of exactly the include's length, where the new object has it
PLACE = "x" * len(INCLUDE)

HEAD, TAIL = text("head", 3000), text("tail", 3000)


def priced(price):
    """A page whose one include frames a price deep inside a long run."""
    return (HEAD + INCLUDE + text("run", 2000) + "<b>price " + price +
            "</b>" + TAIL)


def with_place(filler):
    return HEAD + filler + TAIL + INCLUDE + "end"


CHANGES = {
    # a price changed in text the old plan sends as a stored segment
    "text": (priced("1.10"), priced("1.90")),
    # an include where the old object had text of its length
    "construct": (with_place(PLACE), with_place(INCLUDE)),
    # the old object had no ESI at all: the worker noted it
    "plain": (HEAD + PLACE + TAIL, HEAD + INCLUDE + TAIL),
}

LOCATION = """
            proxy_cache_key $uri;
            proxy_cache_bypass $http_x_refresh;
            esi_cache_purge PURGE from 127.0.0.1;
            esi_plan plans; esi_stitch on; gzip_vary on;
"""


def assembled(body):
    return body.replace(INCLUDE, "A")


# ngx_http_file_cache_header_t: valid_sec, updating_sec, error_sec,
# last_modified and date, the seconds NGINX writes (64-bit time_t each)
SECONDS = slice(8, 48)


class ReplaceAskingTest(EsiTestCase):
    """Every hit asks esid for the plan."""
    HTTP = "esi_plan_zone plans:4m;"
    REUSE = "0"

    def setUp(self):
        super().setUp()
        self.LOCATION = LOCATION + "esi_plan_reuse %s;" % self.REUSE
        self.origin.route("/esi/a", "A", content_type="text/plain")

    def cache_file(self, path):
        return os.path.join(self.tmp, "cache",
                            hashlib.md5(path.encode()).hexdigest())

    def stored_seconds(self, path):
        """The seconds of path's cache file header (SECONDS)."""
        with open(self.cache_file(path), "rb") as f:
            return f.read(SECONDS.stop)[SECONDS]

    def restamp(self, path, seconds, mtime_ns):
        """Writes `seconds` into path's cache file header and gives the
        file the modification time `mtime_ns`."""
        name = self.cache_file(path)
        with open(name, "r+b") as f:
            f.seek(SECONDS.start)
            f.write(seconds)
        os.utime(name, ns=(mtime_ns, mtime_ns))

    def page(self, path, gzip, status="HIT", headers=None):
        code, hdrs, body = self.get(path, dict(GZIP if gzip else {},
                                               **(headers or {})))
        self.assertEqual(code, 200)
        self.assertEqual(hdrs.get("X-Cache-Status"), status)
        return gunzip(body) if gzip else body

    def replace(self, old, new, how):
        """Caches old, hits it until the worker and esid know it (a plan,
        segments, the worker's copy), then stores new in its place, by
        `how`, as if within the same second (the module docstring).
        Returns the path."""
        path = "/" + how
        self.origin.route(path, old, headers=VALIDATORS)
        self.assertEqual(self.page(path, True, "MISS"),
                         assembled(old).encode())
        for gzip in (True, False):
            for _ in range(3):
                self.assertEqual(self.page(path, gzip),
                                 assembled(old).encode())
        seconds = self.stored_seconds(path)
        mtime_ns = os.stat(self.cache_file(path)).st_mtime_ns
        self.origin.route(path, new, headers=VALIDATORS)
        if how == "purge":
            r = self.fetch(path, method="PURGE")
            self.assertEqual(r.status, 200, r.body)
            stored = self.page(path, True, "MISS")
        else:
            stored = self.page(path, True, "BYPASS", {"X-Refresh": "1"})
        self.assertEqual(stored, assembled(new).encode())
        self.restamp(path, seconds, mtime_ns)
        return path

    def assertReplaced(self, change, how):
        old, new = CHANGES[change]
        self.assertEqual(len(old), len(new))
        path = self.replace(old, new, how)
        for _ in range(3):
            for gzip in (False, True):
                self.assertEqual(self.page(path, gzip),
                                 assembled(new).encode(),
                                 "gzip" if gzip else "plain")
        self.assertNotIn("plan dropped", self.error_log())

    def test_a_changed_price_after_a_purge(self):
        self.assertReplaced("text", "purge")

    def test_a_changed_price_after_a_bypass(self):
        self.assertReplaced("text", "bypass")

    def test_an_include_where_text_was_after_a_purge(self):
        self.assertReplaced("construct", "purge")

    def test_an_include_where_text_was_after_a_bypass(self):
        self.assertReplaced("construct", "bypass")

    def test_an_include_in_an_object_that_had_no_esi_after_a_purge(self):
        self.assertReplaced("plain", "purge")

    def test_an_include_in_an_object_that_had_no_esi_after_a_bypass(self):
        self.assertReplaced("plain", "bypass")


    def test_a_purge_forgets_the_plans_of_what_it_removes(self):
        old, new = CHANGES["text"]
        self.replace(old, new, "purge")
        r = self.esictl("plans", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        zone = json.loads(r.stdout)["plans"]
        self.assertGreaterEqual(zone["purged"], 1)
        self.assertEqual(zone["entries"], 0)    # the new one's is not yet


class ReplaceAskingOpenFileCacheTest(ReplaceAskingTest):
    """The same with NGINX's open_file_cache, as README's configuration
    has it: the cache file's descriptor is kept between hits."""
    HTTP = ReplaceAskingTest.HTTP + " open_file_cache max=100;"


class ReplaceReusingTest(ReplaceAskingTest):
    """Hits replay the worker's copy of the plan."""
    REUSE = "1h"

    def test_a_purge_lets_go_of_the_workers_copy_at_once(self):
        old, _ = CHANGES["text"]
        self.origin.route("/p", old, headers=VALIDATORS)
        self.page("/p", True, "MISS")
        for _ in range(2):                       # records, then kept
            self.page("/p", True)
        # the copy's count (the request's goes once the worker ended it)
        self.assertTrue(poll(lambda: self.stats_json()["segment_pins"] == 1,
                             bound=10.0), "the copy holds no pin")
        r = self.fetch("/p", method="PURGE")
        self.assertEqual(r.status, 200, r.body)
        # the copy would hold its pin for the hour it may be replayed
        self.assertTrue(poll(lambda: self.stats_json()["segment_pins"] == 0,
                             bound=10.0), "the purged copy pins segments")


class ReplaceReusingOpenFileCacheTest(ReplaceReusingTest):
    HTTP = ReplaceReusingTest.HTTP + " open_file_cache max=100;"
