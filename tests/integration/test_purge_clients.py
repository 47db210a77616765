"""Purges as the clients that send them really do, request for request:
Magento 2 (PURGE / with X-Magento-Tags-Pattern, pages tagged with
X-Magento-Tags), Drupal's purge_purger_http (BAN / with Cache-Tags),
Varnish xkey (PURGE with xkey), FOSHttpCache (PURGEKEYS with xkey-purge
and xkey-softpurge), Cloudflare-style Cache-Tag pages, and a purge of the
whole zone; what is left on disk and what the next request gets."""

import json
from xml.etree import ElementTree

from harness import poll
from test_purge import PurgeTestCase

# The methods those clients send, to the cached location, as a site moving
# from Varnish would allow them.
CLIENTS_LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE BAN PURGEKEYS from 127.0.0.1;
"""

# The separate-location form, whose key may be a bare "*".
PURGE_LOCATION = """
        location ~ ^/purge/(.*)$ {
            allow 127.0.0.1;
            deny all;
            esi_cache_purge zone=pages key=$1;
        }
"""


class ClientTestCase(PurgeTestCase):
    LOCATION = CLIENTS_LOCATION
    LOCATIONS = PURGE_LOCATION
    PAGES = {}          # path -> response headers

    def setUp(self):
        super().setUp()
        for path, headers in self.PAGES.items():
            self.origin.route(path, "page " + path, headers=headers)

    def store_all(self):
        for path in self.PAGES:
            self.assertEqual(self.cache_status(path), "MISS")
            self.assertEqual(self.cache_status(path), "HIT")
        self.assertEqual(len(self.cache_files()), len(self.PAGES))

    def assertState(self, missed, hit):
        """Each path of `missed` is gone (the next request a MISS), each of
        `hit` still cached."""
        self.assertEqual(len(self.cache_files()), len(hit))
        for path in hit:
            self.assertEqual(self.cache_status(path), "HIT", path)
        for path in missed:
            self.assertEqual(self.cache_status(path), "MISS", path)


class MagentoTest(ClientTestCase):
    """Magento\\CacheInvalidate\\Model\\PurgeCache: PURGE / with the tags as
    "((^|,)TAG(,|$))" joined with "|"; ".*" flushes everything."""
    PAGES = {
        "/product/42": [("X-Magento-Tags", "store,cat_p_42,cat_c_7")],
        "/category/7": [("X-Magento-Tags", "store,cat_c_7,cat_p_43")],
        "/cms/home": [("X-Magento-Tags", "store,cms_p_1")],
    }

    def test_a_tag_pattern_purges_every_page_with_one_of_its_tags(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern":
                             "((^|,)cat_p_42(,|$))|((^|,)cat_p_43(,|$))"})
        self.assertPurged(r, 200, "tag; count=2")
        self.assertState(missed=["/product/42", "/category/7"],
                         hit=["/cms/home"])

    def test_a_tag_is_matched_whole_not_as_a_prefix(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "((^|,)cat_p_4(,|$))"})
        self.assertPurged(r, 200, "tag; count=0")
        self.assertEqual(len(self.cache_files()), 3)

    def test_a_purge_by_x_magento_tags_is_a_purge_not_a_soft_one(self):
        # the header as pages carry it, sent on a purge by a script
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags": "cms_p_1"})
        self.assertPurged(r, 200, "tag; count=1")
        self.assertState(missed=["/cms/home"],
                         hit=["/product/42", "/category/7"])

    def test_the_flush_pattern_purges_the_whole_zone(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": ".*"})
        self.assertPurged(r, 200, "all; count=3")
        self.assertState(missed=list(self.PAGES), hit=[])

    def test_a_pattern_of_another_shape_is_evaluated_by_esid(self):
        # test_purge_pattern.py has the rest of what RE2 makes of them
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "cat_p_.*"})
        self.assertPurged(r, 200, "pattern; count=2")
        self.assertState(missed=["/product/42", "/category/7"],
                         hit=["/cms/home"])


class DrupalTest(ClientTestCase):
    """purge_purger_http's tag invalidation: BAN / with the tags, space
    separated, in Cache-Tags (or Purge-Cache-Tags); any 4xx is a failed
    invalidation that Drupal retries."""
    PAGES = {
        "/node/1": [("Cache-Tags", "node:1 node_list config:system.site")],
        "/node/2": [("Purge-Cache-Tags", "node:2 node_list")],
        "/user/1": [("Cache-Tags", "user:1")],
    }

    def test_ban_by_cache_tags_purges_the_pages_that_carry_them(self):
        self.store_all()
        r = self.purge("/", {"Cache-Tags": "node_list"}, method="BAN")
        self.assertPurged(r, 200, "tag; count=2")
        self.assertState(missed=["/node/1", "/node/2"], hit=["/user/1"])

    def test_a_tag_nothing_carries_is_not_an_error(self):
        self.store_all()
        r = self.purge("/", {"Purge-Cache-Tags": "node:99"}, method="BAN")
        self.assertPurged(r, 200, "tag; count=0")
        self.assertEqual(len(self.cache_files()), 3)


class XkeyTest(ClientTestCase):
    """varnish-modules xkey (PURGE with xkey:) and FOSHttpCache (PURGEKEYS
    with xkey-purge: or xkey-softpurge:, a soft purge carried out as a
    purge); Cloudflare-style pages tag with Cache-Tag, commas."""
    # room for a header of 10,000 tags (about 60 KB)
    SERVER = "large_client_header_buffers 4 128k;"
    PAGES = {
        "/a": [("xkey", "k1 k2")],
        "/b": [("Cache-Tag", "k2,k3")],
        "/c": [("Surrogate-Key", "k4")],
    }

    def test_purge_with_xkey(self):
        self.store_all()
        self.assertPurged(self.purge("/", {"xkey": "k1"}), 200,
                          "tag; count=1")
        self.assertState(missed=["/a"], hit=["/b", "/c"])

    def test_purge_with_cache_tag_and_commas(self):
        """Cloudflare-style: the purge names its tags as its pages do,
        comma-separated in Cache-Tag; a tag is one tag whatever header
        carried it on the page."""
        self.store_all()
        r = self.purge("/", {"Cache-Tag": "k1,k4"})
        self.assertPurged(r, 200, "tag; count=2")
        self.assertState(missed=["/a", "/c"], hit=["/b"])

    def test_purgekeys_with_xkey_purge_and_several_keys(self):
        self.store_all()
        r = self.purge("/", {"xkey-purge": "k3 k4"}, method="PURGEKEYS")
        self.assertPurged(r, 200, "tag; count=2")
        self.assertState(missed=["/b", "/c"], hit=["/a"])

    def test_a_soft_purge_marks_the_objects_stale_and_keeps_them(self):
        self.store_all()
        r = self.purge("/", {"xkey-softpurge": "k2"}, method="PURGEKEYS")
        self.assertPurged(r, 200, "tag; count=2; soft")
        self.assertEqual(len(self.cache_files()), 3)
        # without proxy_cache_use_stale the next request fetches it again
        for path in ("/a", "/b"):
            self.assertEqual(self.cache_status(path), "EXPIRED", path)
            self.assertEqual(self.cache_status(path), "HIT", path)
        self.assertEqual(self.cache_status("/c"), "HIT")

    def test_ten_thousand_tags_none_cached(self):
        self.store_all()
        tags = " ".join("t%d" % i for i in range(10000))
        r = self.purge("/", {"xkey-purge": tags}, method="PURGEKEYS")
        self.assertPurged(r, 200, "tag; count=0")
        self.assertEqual(len(self.cache_files()), 3)

    def test_a_tag_header_without_a_tag_is_400(self):
        self.store_all()
        r = self.purge("/", {"xkey": " , "})
        self.assertEqual(r.status, 400)
        self.assertEqual(len(self.cache_files()), 3)

    def test_other_methods_still_reach_the_origin(self):
        self.store_all()
        r = self.fetch("/a", method="DELETE")
        self.assertTrue(r.complete)
        self.assertEqual(len(self.cache_files()), 3)


class PurgeAllTest(ClientTestCase):
    """A bare "*" key: every object of the zone (ngx_cache_purge's
    purge_all)."""
    PAGES = {"/x": [], "/y/1": [], "/z?q=1": []}

    def test_a_bare_star_purges_every_object(self):
        self.store_all()
        r = self.purge("/purge/*", method="GET")
        self.assertPurged(r, 200, "all; count=3")
        self.assertState(missed=list(self.PAGES), hit=[])

    def test_a_zone_with_nothing_in_it(self):
        r = self.purge("/purge/*", method="GET")
        self.assertPurged(r, 200, "all; count=0")


class TagHeadersTest(ClientTestCase):
    """esi_purge_tag_headers replaces the list, for the worker's reports and
    for esid's scans alike (a restarted esid reads the zone again)."""
    HTTP = "esi_purge_tag_headers X-Mine;"
    PAGES = {"/m": [("X-Mine", "mine")],
             "/s": [("Surrogate-Key", "mine")]}

    def test_only_the_configured_headers_tag_objects(self):
        self.store_all()
        self.assertPurged(self.purge("/", {"X-Mine": "mine"}), 200,
                          "tag; count=1")
        self.assertState(missed=["/m"], hit=["/s"])

    def test_esids_scan_reads_the_configured_headers(self):
        self.store_all()
        self.esid.stop()
        self.start_esid()
        self.assertPurged(self.purge("/", {"X-Mine": "mine"}), 200,
                          "tag; count=1")
        self.assertState(missed=["/m"], hit=["/s"])


class SoftPurgeTest(ClientTestCase):
    """A soft purge marks objects stale, every variant, for every kind of
    purge: with proxy_cache_use_stale updating and background updates the
    next request gets the stale copy while NGINX fetches the new one."""
    LOCATION = CLIENTS_LOCATION + """
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
"""
    PAGES = {"/s/1": [("Surrogate-Key", "k1")],
             "/s/2": [("Surrogate-Key", "k2")]}

    def assertServedStaleThenNew(self, path):
        self.origin.route(path, "new " + path)
        fetched = self.origin.hits(path)
        code, headers, body = self.get(path)
        self.assertEqual(headers.get("X-Cache-Status"), "STALE")
        self.assertEqual(body, ("page " + path).encode())
        self.assertTrue(self.origin.wait_for_hits(path, fetched + 1))
        self.assertTrue(poll(lambda: self.get(path)[2] ==
                             ("new " + path).encode()),
                        "the background update never stored " + path)
        self.assertEqual(self.cache_status(path), "HIT")

    def test_fastly_soft_purge_of_a_tag(self):
        self.store_all()
        r = self.purge("/", {"Surrogate-Key": "k1", "Fastly-Soft-Purge": "1"})
        self.assertPurged(r, 200, "tag; count=1; soft")
        self.assertEqual(len(self.cache_files()), 2)
        self.assertServedStaleThenNew("/s/1")
        self.assertEqual(self.cache_status("/s/2"), "HIT")

    def test_magentos_soft_purge_of_a_pattern(self):
        self.store_all()
        r = self.purge("/", {"X-Magento-Tags-Pattern": "((^|,)k2(,|$))",
                             "X-Magento-Purge-Soft": "1"})
        self.assertPurged(r, 200, "tag; count=1; soft")
        self.assertServedStaleThenNew("/s/2")

    def test_a_soft_purge_of_a_key(self):
        self.store_all()
        r = self.purge("/s/1", {"Fastly-Soft-Purge": "1"})
        self.assertPurged(r, 200, "exact; count=1; soft")
        self.assertServedStaleThenNew("/s/1")

    def test_a_soft_purge_of_a_key_not_cached_is_404(self):
        r = self.purge("/s/9", {"Fastly-Soft-Purge": "1"})
        self.assertPurged(r, 404, "exact; count=0; soft")


class SoftLocationTest(SoftPurgeTest):
    """esi_cache_purge_soft on: every purge of the location is soft."""
    LOCATION = SoftPurgeTest.LOCATION + "            esi_cache_purge_soft on;"

    def test_a_plain_purge_is_soft_here(self):
        self.store_all()
        self.assertPurged(self.purge("/s/2"), 200, "exact; count=1; soft")
        self.assertServedStaleThenNew("/s/2")


class ResponseTypeTest(ClientTestCase):
    """esi_cache_purge_response_type, as ngx_cache_purge's
    cache_purge_response_type: the answer in JSON, XML or plain text."""
    PAGES = {"/r": [("xkey", "r<&>\"")]}

    def answer(self, kind, path="/r", headers=None):
        self.LOCATION = CLIENTS_LOCATION + \
            "            esi_cache_purge_response_type %s;" % kind
        self.store_all()
        r = self.purge(path, headers)
        return r

    def test_json(self):
        r = self.answer("json", "/r")
        self.assertEqual(r.header("Content-Type"), "application/json")
        self.assertEqual(json.loads(r.body), {
            "Key": "/r", "Status": "purged",    # ngx_cache_purge 3.0's
            "status": "purged", "kind": "exact", "key": "/r", "count": 1,
            "soft": False})

    def test_json_escapes_the_key(self):
        r = self.answer("json", "/", {"xkey": 'r<&>"'})
        self.assertEqual(json.loads(r.body)["key"], 'r<&>"')

    def test_xml(self):
        r = self.answer("xml", "/", {"xkey": 'r<&>"'})
        self.assertEqual(r.header("Content-Type"), "text/xml")
        root = ElementTree.fromstring(r.body)
        self.assertEqual(root.findtext("status"), "purged")
        self.assertEqual(root.findtext("kind"), "tag")
        self.assertEqual(root.findtext("key"), 'r<&>"')
        self.assertEqual(root.findtext("count"), "1")

    def test_text_and_a_miss(self):
        self.LOCATION = CLIENTS_LOCATION + \
            "            esi_cache_purge_response_type text;"
        r = self.purge("/never")
        self.assertEqual(r.status, 404)
        self.assertEqual(r.header("Content-Type"), "text/plain")
        self.assertEqual(r.body, b"Key: /never\r\nStatus: not cached\r\n"
                                 b"exact: 0 file(s) removed\r\n")


class TagHeadersConfigurationTest(ClientTestCase):
    ESID = False

    def nginx_t(self, http):
        from test_limits import ConfigurationErrorTest
        self.HTTP = http
        return ConfigurationErrorTest.nginx_t(self, self.LOCATION)

    def test_a_name_that_is_no_header_name_stops_nginx_t(self):
        for bad, says in (("esi_purge_tag_headers X-Tags:;", "invalid header"),
                          ("esi_purge_tag_headers %s;" % ("x" * 65),
                           "longer than 64 bytes"),
                          ("esi_purge_tag_headers %s;" % " ".join(
                              "h%d" % i for i in range(33)), "at most 32")):
            code, out = self.nginx_t(bad)
            self.assertNotEqual(code, 0, bad)
            self.assertIn(says, out)
        code, out = self.nginx_t("esi_purge_tag_headers X-Tags Surrogate-Key;")
        self.assertEqual(code, 0, out)
