"""Pattern purges: X-Magento-Tags-Pattern in any shape, evaluated by esid
with RE2 against each object's comma-joined tags, as Magento's VCL bans
`obj.http.X-Magento-Tags ~ pattern` (Magento 2,
Magento/PageCache/etc/varnish6.vcl; the request is PurgeCache.php's: PURGE /
with the pattern and nothing else).  What is left on disk, what the next
request gets, the 400s, a pattern over 64 KiB, a pattern that would make a
backtracking engine run for ever, an object with 10,000 tags, esictl purge
--pattern, and the same over a zone esid reads from its directory."""

import json

from test_purge import PurgeTestCase
from test_purge_clients import CLIENTS_LOCATION, ClientTestCase

CATALOG = {
    "/p/41": [("X-Magento-Tags", "cat_p_41,store")],
    "/p/42": [("X-Magento-Tags", "store,cat_p_42")],
    "/p/400": [("X-Magento-Tags", "cat_p_400")],
    "/p/420": [("X-Magento-Tags", "cat_p_420,store")],
    "/c/42": [("X-Magento-Tags", "store,cat_c_42,cms_b_3")],
    "/cms": [("X-Magento-Tags", "store,cms_p_1")],
}

# Headers this long reach the purge only with buffers to hold them.
LONG_HEADERS = "large_client_header_buffers 4 160k;"


class CatalogTestCase(ClientTestCase):
    PAGES = CATALOG

    def assertPurgesThe42s(self, path_taken):
        """(^|,)cat_(p|c)_42(,|$) purges the product and the category 42,
        and the error log says which way esid found them."""
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern":
                             "(^|,)cat_(p|c)_42(,|$)"})
        self.assertPurged(r, 200, "pattern; count=2")
        self.assertState(missed=["/p/42", "/c/42"],
                         hit=["/p/41", "/p/400", "/p/420", "/cms"])
        self.assertIn('pattern purge of "(^|,)cat_(p|c)_42(,|$)": 2 file(s) '
                      'removed, ' + path_taken, self.error_log())

    def assertRefused(self, pattern, reason):
        r = self.purge("/", {"X-Magento-Tags-Pattern": pattern})
        self.assertEqual(r.status, 400, r.body)
        self.assertIsNone(r.header("Cache-Purge-Result"))
        self.assertEqual(self.error_log().count(reason), 1, reason)
        self.assertEqual(len(self.cache_files()), len(CATALOG))
        return r


class PatternTest(CatalogTestCase):
    HTTP = LONG_HEADERS

    def test_an_anchored_pattern_purges_the_objects_whose_list_starts_so(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^cat_p_4[0-9]"})
        self.assertPurged(r, 200, "pattern; count=3")
        self.assertIn(b"Pattern: ^cat_p_4[0-9]", r.body)
        self.assertState(missed=["/p/41", "/p/400", "/p/420"],
                         hit=["/p/42", "/c/42", "/cms"])

    def test_alternatives_inside_a_tag_purge_exactly_those_tags(self):
        self.assertPurgesThe42s("via variant index")

    def test_a_pattern_may_span_tags_as_in_the_joined_header(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "cat_c_42,cms_"})
        self.assertPurged(r, 200, "pattern; count=1")
        self.assertState(missed=["/c/42"], hit=[p for p in CATALOG
                                                 if p != "/c/42"])

    def test_magentos_own_shape_still_purges_by_tag(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern":
                             "((^|,)cat_p_42(,|$))|((^|,)cms_p_1(,|$))"})
        self.assertPurged(r, 200, "tag; count=2")
        self.assertState(missed=["/p/42", "/cms"],
                         hit=["/p/41", "/p/400", "/p/420", "/c/42"])

    def test_a_pattern_that_matches_nothing_is_200_and_count_0(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^nothing_[0-9]+$"})
        self.assertPurged(r, 200, "pattern; count=0")
        self.assertEqual(len(self.cache_files()), len(CATALOG))

    def test_a_malformed_pattern_is_400_and_removes_nothing(self):
        self.store_all()
        r = self.assertRefused("((a", "bad pattern: missing )")
        self.assertIn(b"missing )", r.body)
        self.assertEqual(self.esid.stderr().count("pattern purge refused"),
                         1)
        self.assertState(missed=[], hit=list(CATALOG))

    def test_a_pattern_re2_cannot_run_linearly_is_400(self):
        self.store_all()
        self.assertRefused("(cat)_p_\\1", "invalid escape sequence")

    def test_an_empty_pattern_is_400(self):
        self.store_all()
        self.assertRefused("", "an empty tag pattern is refused")

    def test_a_pattern_over_64_kib_is_400_and_one_of_64_kib_is_evaluated(self):
        self.store_all()
        self.assertRefused("cms_p_1|" + "z" * (64 * 1024 - 7),
                           "a tag pattern of 65537 bytes is refused")
        r = self.purge("/", {"X-Magento-Tags-Pattern":
                             "cms_p_1|" + "z" * (64 * 1024 - 8)})
        self.assertPurged(r, 200, "pattern; count=1")
        self.assertState(missed=["/cms"], hit=[p for p in CATALOG
                                               if p != "/cms"])

    def test_a_pattern_with_tags_beside_it_is_400(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^cat",
                             "X-Magento-Tags": "store"})
        self.assertEqual(r.status, 400)
        self.assertIn("a tag pattern is refused beside tags", self.error_log())
        self.assertEqual(len(self.cache_files()), len(CATALOG))

    def test_a_backtracking_bomb_runs_linearly_and_answers_right(self):
        # (a+)+$ against 40 a's and a "b" takes a backtracking engine some
        # 2^40 steps; the purge would outlive the request's timeout.
        bomb = "a" * 40 + "b"
        self.origin.route("/bomb", "bomb", headers=[("X-Magento-Tags", bomb)])
        self.origin.route("/as", "as", headers=[("X-Magento-Tags",
                                                 "x," + "a" * 40)])
        for path in ("/bomb", "/as"):
            self.assertEqual(self.cache_status(path), "MISS")
        r = self.purge("/", {"X-Magento-Tags-Pattern": "(a+)+$"})
        self.assertPurged(r, 200, "pattern; count=1")
        self.assertEqual(self.cache_status("/as"), "MISS")
        self.assertEqual(self.cache_status("/bomb"), "HIT")

    def test_esictl_purges_by_pattern_and_refuses_a_malformed_one(self):
        self.store_all()
        r = self.esictl("purge", "pages", "^cat_p_4[0-9]", "--pattern",
                        "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        answer = json.loads(r.stdout)
        self.assertEqual((answer["kind"], answer["count"]), ("pattern", 3))
        self.assertState(missed=["/p/41", "/p/400", "/p/420"],
                         hit=["/p/42", "/c/42", "/cms"])
        r = self.esictl("purge", "pages", "((a", "--pattern")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"missing )", r.stderr)
        self.assertEqual(len(self.cache_files()), len(CATALOG))


class PatternSoftTest(CatalogTestCase):
    """X-Magento-Purge-Soft: 1 marks the matches stale, as for tags."""
    LOCATION = CLIENTS_LOCATION + """
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
"""

    def test_a_soft_pattern_purge_marks_its_matches_stale_and_keeps_them(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^cat_p_4[0-9]",
                             "X-Magento-Purge-Soft": "1"})
        self.assertPurged(r, 200, "pattern; count=3; soft")
        self.assertEqual(len(self.cache_files()), len(CATALOG))
        for path in ("/p/41", "/p/400", "/p/420"):
            self.assertEqual(self.cache_status(path), "STALE", path)
        for path in ("/p/42", "/c/42", "/cms"):
            self.assertEqual(self.cache_status(path), "HIT", path)
        # the index kept them: a second pattern purge finds them again
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^cat_p_41"})
        self.assertPurged(r, 200, "pattern; count=1")


class PatternOverTheDirectoryTest(CatalogTestCase):
    """With no index, esid evaluates the pattern over what its scan of the
    zone's directory read (the tags in each file's header)."""
    HTTP = "esi_purge_index off;"

    def test_the_pattern_finds_the_same_objects_in_the_files(self):
        self.assertPurgesThe42s("zone directory read")

    def test_a_malformed_pattern_is_400_here_too(self):
        self.store_all()
        self.assertRefused("((a", "bad pattern: missing )")


class TenThousandTagsTest(PurgeTestCase):
    """A response with 10,000 tags (58,889 bytes of X-Magento-Tags: an
    upstream buffer that holds it, and NGINX's 64 KiB cache header) is
    stored, reported to esid and purged by a tag or a pattern."""
    LOCATION = CLIENTS_LOCATION + """
            proxy_buffer_size 96k;
            proxy_buffers 4 96k;
            proxy_busy_buffers_size 96k;
"""
    # Indexing 10,000 tags under ASan on a busy machine can keep esid past
    # the 2 s default; a late answer drops the worker's connection, and the
    # index with it, which is not what these tests are about.
    HTTP = "esi_daemon_timeout 120s;"
    TAGS = ",".join("t%d" % i for i in range(10000))

    def store(self):
        self.origin.route("/many", "many",
                          headers=[("X-Magento-Tags", self.TAGS)])
        self.origin.route("/few", "few", headers=[("X-Magento-Tags", "t1")])
        for path in ("/many", "/few"):
            self.assertEqual(self.cache_status(path), "MISS")
            self.assertEqual(self.cache_status(path), "HIT")
        self.assertEqual(len(self.cache_files()), 2)

    def test_a_pattern_finds_its_last_tag(self):
        self.store()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "(^|,)t999[0-9](,|$)"})
        self.assertPurged(r, 200, "pattern; count=1")
        self.assertEqual(self.cache_status("/many"), "MISS")
        self.assertEqual(self.cache_status("/few"), "HIT")

    def test_a_tag_finds_it_through_the_index(self):
        self.store()
        r = self.purge("/", {"X-Magento-Tags": "t9999"})
        self.assertPurged(r, 200, "tag; count=1")
        self.assertIn("via variant index", self.error_log())
        self.assertEqual(self.cache_status("/many"), "MISS")
        self.assertEqual(self.cache_status("/few"), "HIT")


class TagsOver64KiBTest(PurgeTestCase):
    """Tags past 64 KiB (120,000 bytes here, hidden from the client): NGINX
    cannot store such a header in a cache file (16-bit offsets: it calls
    the file invalid and never serves it), and esid would refuse the
    report; the worker reports the whole tags that fit, warns, and keeps
    its connection, so the index stays complete."""
    LOCATION = CLIENTS_LOCATION + """
            proxy_buffer_size 192k;
            proxy_buffers 4 192k;
            proxy_busy_buffers_size 192k;
            proxy_hide_header X-Magento-Tags;
"""

    def test_the_report_is_cut_to_whole_tags_and_the_connection_kept(self):
        tags = ",".join("tag_%05d" % i for i in range(12000))
        self.origin.route("/big", "big", headers=[("X-Magento-Tags", tags)])
        self.origin.route("/small", "small",
                          headers=[("X-Magento-Tags", "small")])
        self.assertEqual(self.cache_status("/big"), "MISS")
        self.assertEqual(self.cache_status("/small"), "MISS")
        self.assertIn('"/big" has 119999 bytes of tags, esid indexes the '
                      'first 65529', self.error_log())
        r = self.purge("/", {"X-Magento-Tags-Pattern": "^small$"})
        self.assertPurged(r, 200, "pattern; count=1")
        self.assertIn("via variant index", self.error_log())
        self.assertNotIn("closing it", self.esid.stderr())
        self.assertEqual(self.cache_status("/small"), "MISS")
