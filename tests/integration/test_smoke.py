"""The smoke run each NGINX version gets (tests/nginx-versions.sh): a page
assembled from nested includes, a gzip client's page stitched from stored
segments, a purge that removes every Vary variant of a key, and a reload
after which the new workers serve processed pages.  Each is one behaviour
the whole suite proves in depth; together they show the module loads and
works in that NGINX."""

import unittest

from harness import EsiTestCase, poll
from test_purge import PurgeTestCase
from test_reload import ReloadTestCase
from test_stitch import StitchTestCase, assembled, gunzip, page, runs_of

ATTACHED = "esi: attached to esid"


class AssembledPageTest(EsiTestCase):

    def test_a_page_of_nested_includes_is_assembled(self):
        self.origin.route("/", 'a<esi:include src="/esi/f"/>d')
        self.origin.route("/esi/f", 'b<esi:include src="/esi/g"/>c')
        self.origin.route("/esi/g", "[g]")
        self.assertBody("/", b"ab[g]cd")


class StitchedPageTest(StitchTestCase):

    def test_a_gzip_client_gets_the_page_stitched_from_segments(self):
        runs = runs_of("s")
        body = page(runs)
        self.warm("/s", body)
        raw = self.gz("/s")
        self.assertEqual(gunzip(raw), assembled(body).encode())
        self.assertStitched(raw, runs)


class VaryPurgeTest(PurgeTestCase):

    def test_a_purge_removes_every_vary_variant(self):
        self.store_two_variants()
        self.assertPurged(self.purge("/v"), 200, "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/v", "a"), "MISS")


class ReloadTest(ReloadTestCase):

    def test_after_a_reload_the_new_workers_serve_processed_pages(self):
        self.warm()
        attached = self.error_log().count(ATTACHED)
        self.nginx_command("-s", "reload")
        self.assertTrue(poll(lambda: self.error_log().count(ATTACHED)
                             >= attached + self.WORKERS, bound=20.0),
                        "the new workers did not attach to esid")
        self.warm()


if __name__ == "__main__":
    unittest.main()
