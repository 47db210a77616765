"""Surrogate headers (W3C Note "Edge Architecture Specification 1.0"):
`esi_surrogate NAME` tells the origin what we are, `esi_surrogate_control
on` lets the origin's Surrogate-Control decide what is processed and how
long the cached object lives.  Exact bytes, the headers the origin
received, and the cache file's own header."""

import glob
import os
import struct
import unittest

from harness import EsiTestCase

PAGE = 'a<esi:include src="/esi/x"/>c'


def cache_validity(tmp):
    """valid_sec - date of the one cache file (nginx's header, version 5:
    valid_sec @8, date @40, little-endian time_t)."""
    files = [f for f in glob.glob(os.path.join(tmp, "cache", "**"),
                                  recursive=True) if os.path.isfile(f)]
    assert len(files) == 1, files
    with open(files[0], "rb") as f:
        header = f.read(48)
    valid_sec, = struct.unpack_from("<q", header, 8)
    date, = struct.unpack_from("<q", header, 40)
    return valid_sec - date


class CapabilityTest(EsiTestCase):
    LOCATION = "esi_surrogate edge;"
    FRAGMENT_LOCATION = "esi_surrogate edge;"

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")
        self.origin.route("/page", PAGE)

    def capabilities(self, path):
        return [[v for k, v in headers.items()
                 if k.lower() == "surrogate-capability"]
                for method, target, headers in self.origin.requests()
                if target == path]

    def test_the_origin_is_told_we_process_esi(self):
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.capabilities("/page"), [['edge="ESI/1.0"']])

    def test_an_include_is_told_too(self):
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.capabilities("/esi/x"), [['edge="ESI/1.0"']])

    def test_a_client_cannot_forge_the_capability(self):
        self.assertBody("/page", b"aXc", headers={
            "Surrogate-Capability": 'evil="ESI/1.0 ESI-INLINE/1.0"'})
        self.assertEqual(self.capabilities("/page"), [['edge="ESI/1.0"']])
        self.assertEqual(self.capabilities("/esi/x"), [['edge="ESI/1.0"']])

    def test_a_client_sending_ours_still_sends_it_once(self):
        self.assertBody("/page", b"aXc", headers={
            "Surrogate-Capability": 'edge="ESI/1.0"'})
        self.assertEqual(self.capabilities("/page"), [['edge="ESI/1.0"']])


class NoCapabilityTest(EsiTestCase):

    def test_without_esi_surrogate_nothing_is_added(self):
        self.origin.route("/page", "plain")
        self.assertBody("/page", b"plain")
        method, target, headers = self.origin.requests()[0]
        self.assertNotIn("surrogate-capability",
                         [k.lower() for k in headers])


class SurrogateControlTest(EsiTestCase):
    LOCATION = "esi_surrogate edge;\n            esi_surrogate_control on;"

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")

    def page(self, control, path="/page"):
        headers = [("Surrogate-Control", control)] if control else []
        self.origin.route(path, PAGE, headers=headers)

    def get_page(self, path="/page"):
        status, headers, body = self.get(path)
        self.assertEqual(status, 200)
        self.assertIsNone(headers.get("Surrogate-Control"),
                          "the client saw Surrogate-Control")
        return headers.get("X-Cache-Status"), body

    def test_content_esi_is_processed(self):
        self.page('content="ESI/1.0"')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))

    def test_without_surrogate_control_markup_passes_untouched(self):
        self.page(None)
        self.assertEqual(self.get_page(), ("MISS", PAGE.encode()))
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_content_for_another_surrogate_is_not_ours(self):
        self.page('content="ESI/1.0";other')
        self.assertEqual(self.get_page(), ("MISS", PAGE.encode()))

    def test_content_targeted_at_us_is_processed(self):
        self.page('max-age=60;other, content="ESI/1.0";edge')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))

    def test_a_list_of_content_types_is_understood(self):
        self.page('content="ESI-INLINE/1.0 ESI/1.0"')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))

    def test_a_hit_decides_as_the_miss_did(self):
        self.page('content="ESI/1.0"')
        self.page(None, "/raw")
        for status in ("MISS", "HIT"):
            self.assertEqual(self.get_page(), (status, b"aXc"))
            self.assertEqual(self.get_page("/raw"), (status, PAGE.encode()))
        self.assertEqual(self.origin.hits("/page"), 1)

    def test_no_store_keeps_the_page_out_of_the_cache(self):
        self.page('content="ESI/1.0", no-store')
        for _ in range(2):
            self.assertEqual(self.get_page(), ("MISS", b"aXc"))
        self.assertEqual(self.origin.hits("/page"), 2)

    def test_no_store_for_another_surrogate_is_not_ours(self):
        self.page('content="ESI/1.0", no-store;other')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))
        self.assertEqual(self.get_page(), ("HIT", b"aXc"))

    def test_max_age_sets_the_cached_lifetime(self):
        # proxy_cache_valid says 10m; Surrogate-Control wins
        self.page('content="ESI/1.0", max-age=1234+60')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))
        self.assertEqual(cache_validity(self.tmp), 1234)

    def test_max_age_targeted_at_us_wins_over_an_untargeted_one(self):
        self.page('max-age=300;edge, content="ESI/1.0", max-age=100')
        self.get_page()
        self.assertEqual(cache_validity(self.tmp), 300)

    def test_max_age_zero_is_not_cached(self):
        self.page('content="ESI/1.0", max-age=0')
        self.get_page()
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))

    def test_junk_directives_are_skipped(self):
        self.page(';;, ,=,max-age=abc, content=, max-age=-5, '
                  'content="ESI/1.0" , x;;y, max-age=77, z="open, no-store')
        self.assertEqual(self.get_page(), ("MISS", b"aXc"))
        self.assertEqual(cache_validity(self.tmp), 77)


class SurrogateControlOffTest(EsiTestCase):
    """The default: every response of an esi location is processed, and a
    processed one loses its Surrogate-Control."""

    def test_markup_is_processed_without_surrogate_control(self):
        self.origin.route("/esi/x", "X")
        self.origin.route("/page", PAGE)
        self.assertBody("/page", b"aXc")


if __name__ == "__main__":
    unittest.main()
