"""The smoke run each NGINX version gets (tests/build-matrix.sh): a page
assembled from nested includes, a gzip client's page stitched from stored
segments, a purge that removes every Vary variant of a key (tests of their
own files, named here), and a reload after which the new workers serve
processed pages.  Each is one behaviour the whole suite proves in depth;
together they show the module loads and works in that NGINX."""

import unittest

from harness import poll
from test_reload import ReloadTestCase

ATTACHED = "esi: attached to esid"

SMOKE = [
    "test_markup.IncludeTest.test_fragment_with_esi_is_itself_processed",
    "test_stitch.StitchTest."
    "test_a_planned_hit_sends_each_runs_segment_in_valid_gzip",
    "test_purge.SameLocationTest.test_purge_removes_every_vary_variant",
]


class ReloadTest(ReloadTestCase):

    def test_after_a_reload_the_new_workers_serve_processed_pages(self):
        self.warm()
        attached = self.error_log().count(ATTACHED)
        self.nginx_command("-s", "reload")
        self.assertTrue(poll(lambda: self.error_log().count(ATTACHED)
                             >= attached + self.WORKERS, bound=20.0),
                        "the new workers did not attach to esid")
        self.warm()


def load_tests(loader, tests, pattern):
    tests.addTests(loader.loadTestsFromNames(SMOKE))
    return tests


if __name__ == "__main__":
    unittest.main()
