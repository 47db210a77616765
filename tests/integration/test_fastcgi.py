"""ESI and purge over a FastCGI application in fastcgi_cache: a real
FastCGI server (Debian's fcgiwrap running a CGI script), pages assembled and
planned as over proxy_cache, and purged as WordPress' nginx-helper purges
them (GET /purge/<path> through a location of its own whose key is the
cache key, "$scheme$request_method$host$1") and with PURGE in the cached
location itself; and with ngx_cache_purge's own fastcgi_cache_purge lines
kept as they are."""

import os
import shutil
import stat

from harness import DidNotStart, EsiTestCase, start_on_socket
from test_purge import PurgeTestCase

PAGE_SCRIPT = r"""#!/bin/sh
case "$REQUEST_URI" in
    /blog/hello*) tag=post-1 ;;
    *) tag=post-2 ;;
esac
printf 'Content-Type: text/html\r\nCache-Tags: %s\r\n\r\n' "$tag"
printf '<p>%s</p><esi:include src="/esi/a"/>' "$REQUEST_URI"
"""

FASTCGI = """
            fastcgi_pass unix:@@TMP@@/fcgi.sock;
            fastcgi_param SCRIPT_FILENAME @@TMP@@/page.sh;
            fastcgi_param REQUEST_URI $request_uri;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param QUERY_STRING $query_string;
            fastcgi_cache_valid 200 10m;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
"""


class AppCacheTestCase(EsiTestCase):
    """Pages from an application server cached by NGINX (fastcgi_cache
    here, uwsgi_cache and scgi_cache in test_uwsgi.py): each page is its
    path, then the fragment /esi/a ("A") from the origin."""

    MISS = 404      # a purge's answer to a key not cached: 412 with
                    # ngx_cache_purge's lines (cache_purge_legacy_status)

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/a", "A", content_type="text/plain")

    def files(self, zone):
        found = []
        for root, _, names in os.walk(os.path.join(self.tmp, zone)):
            found += [n for n in names if len(n) == 32]
        return found

    def assertPurge(self, r, status, result, key):
        """A purge's answer: its status and Cache-Purge-Result, and the key
        it tried, which the HTML body names."""
        PurgeTestCase.assertPurged(self, r, status, result)
        self.assertIn(("Key: %s</p>" % key).encode(), r.body)

    def assertMiss(self, r, key):
        """A purge that found nothing: MISS, count=0, the key it tried."""
        self.assertPurge(r, self.MISS, "exact; count=0", key)
        self.assertIn(b"<h1>Not cached</h1>", r.body)

    def assertMissesRemoveNothing(self, zone, cached, key, *purges):
        """cached stored in zone, each purge (path, method) finds nothing
        (assertMiss, naming key): the file is kept, cached still a HIT."""
        self.page(cached, "MISS")
        before = sorted(self.files(zone))
        self.assertEqual(len(before), 1)
        for path, method in purges:
            self.assertMiss(self.fetch(path, method=method), key)
        self.assertEqual(sorted(self.files(zone)), before)
        self.page(cached, "HIT")

    def assertPurgesOnly(self, zone, path, other, purge, method="GET",
                         key=None):
        """path and other cached in zone, the request `purge` (with method)
        purges path only: 200, count=1 naming path's key (by default path
        itself), one file left, path a MISS next and other still a HIT."""
        for page in (path, other):
            self.page(page, "MISS")
        r = self.fetch(purge, method=method)
        self.assertPurge(r, 200, "exact; count=1", key or path)
        self.assertEqual(len(self.files(zone)), 1)
        self.page(path, "MISS")
        self.page(other, "HIT")

    def page(self, path, status):
        code, headers, body = self.get(path)
        self.assertEqual(code, 200)
        self.assertEqual(headers.get("X-Cache-Status"), status, path)
        self.assertEqual(body, ("<p>%s</p>A" % path).encode())


class FastcgiTestCase(AppCacheTestCase):
    HTTP = """
    fastcgi_cache_path @@TMP@@/wordpress keys_zone=WORDPRESS:16m;
    fastcgi_cache_path @@TMP@@/shop keys_zone=SHOP:16m;
"""
    LOCATIONS = """
        # nginx-helper's documented block, on our module
        location /blog/ {
%(fastcgi)s
            fastcgi_cache WORDPRESS;
            fastcgi_cache_key "$scheme$request_method$host$request_uri";
        }

        location ~ /purge(/.*) {
            allow 127.0.0.1;
            deny all;
            esi_cache_purge zone=WORDPRESS key=$scheme$request_method$host$1;
        }

        # the same-location form over FastCGI
        location /shop/ {
%(fastcgi)s
            fastcgi_cache SHOP;
            fastcgi_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
        }
""" % {"fastcgi": FASTCGI}

    def setUp(self):
        super().setUp()
        script = os.path.join(self.tmp, "page.sh")
        with open(script, "w") as f:
            f.write(PAGE_SCRIPT)
        os.chmod(script, stat.S_IRWXU)
        tool = shutil.which("fcgiwrap") or "/usr/sbin/fcgiwrap"
        sock = os.path.join(self.tmp, "fcgi.sock")
        try:
            start_on_socket(self.spawn, "fcgiwrap",
                            [tool, "-s", "unix:" + sock], sock)
        except DidNotStart as e:
            self.fail("fcgiwrap did not start:\n%s" % e.log)


def replaced(text, old, new):
    """text with old, which it must hold, replaced by new."""
    assert old in text, old
    return text.replace(old, new)


# ngx_cache_purge's fastcgi_cache_purge where FastcgiTestCase has
# esi_cache_purge: the separate location as nginx-helper's tutorial writes it
# (easyengine.io, "WordPress + Nginx + fastcgi_cache with conditional
# purging"), the same-location form as ngx_cache_purge's README does
COMPAT_LOCATIONS = replaced(replaced(
    FastcgiTestCase.LOCATIONS,
    "esi_cache_purge zone=WORDPRESS key=$scheme$request_method$host$1;",
    'fastcgi_cache_purge WORDPRESS "$scheme$request_method$host$1";'),
    "esi_cache_purge PURGE from 127.0.0.1;",
    "fastcgi_cache_purge PURGE from 127.0.0.1;")

# What wp_remote_get() sends (WP_Http::request: its User-Agent, and
# WP_Http_Encoding::accept_encoding() where PHP has zlib); nginx-helper
# adds no field of its own
WORDPRESS_GET = {
    "User-Agent": "WordPress/6.7.1; http://127.0.0.1",
    "Accept-Encoding": "deflate;q=1.0, compress;q=0.5, gzip;q=0.5",
}


class FastcgiEsiTest(FastcgiTestCase):

    def test_pages_from_fastcgi_cache_are_assembled_and_planned(self):
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.page("/blog/hello/", status)
        self.assertGreaterEqual(self.stats_json()["planned"], 1)


class NginxHelperTest(FastcgiTestCase):
    """nginx-helper (ngx_cache_purge mode): GET /purge/<path>, also for the
    feed forms; 200 is purged, a miss not cached."""
    def helper_get(self, path):
        """A GET as nginx-helper's do_remote_get() sends it
        (admin/class-purger.php: wp_remote_get( $url ))."""
        r = self.fetch(path, WORDPRESS_GET)
        self.assertTrue(r.complete, "GET %s: %r" % (path, r))
        return r

    def test_get_purge_path_removes_the_page_and_only_it(self):
        for path in ("/blog/hello/", "/blog/hello/feed/", "/blog/other/"):
            self.page(path, "MISS")
        self.assertEqual(len(self.files("wordpress")), 3)
        for path in ("/blog/hello/", "/blog/hello/feed/"):
            r = self.fetch("/purge" + path)
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=1")
        self.assertEqual(len(self.files("wordpress")), 1)
        self.page("/blog/hello/", "MISS")
        self.page("/blog/other/", "HIT")

    def test_a_page_not_cached_is_a_miss_that_removes_nothing(self):
        self.assertMissesRemoveNothing(
            "wordpress", "/blog/hello/", "httpGET127.0.0.1/blog/never/",
            ("/purge/blog/never/", "GET"))

    def test_a_posts_purge_as_nginx_helper_sends_it(self):
        """What nginx-helper (2.3.0 to 2.3.5, and rtCamp/nginx-helper's
        master at 34cd216) requests when a post is edited
        (purge_page_on_mod and purge_feeds on, as by default), in
        get_request mode: admin/class-fastcgi-purger.php, purge_url(): the
        purge base ("/purge") with the post's path, then "feed/",
        "feed/atom/" and "feed/rdf/" under it; then, where is_page() or
        is_single() and purge_amp_urls (on by default),
        purge_amp_version(): "amp/" under the post's own URL, not under
        /purge, so that GET fetches the AMP page and purges nothing (here
        as with ngx_cache_purge).  Each GET as wp_remote_get() sends it."""
        for path in ("/blog/hello/", "/blog/hello/feed/",
                     "/blog/hello/amp/", "/blog/other/"):
            self.page(path, "MISS")
        self.assertEqual(len(self.files("wordpress")), 4)
        r = self.helper_get("/purge/blog/hello/")
        self.assertPurge(r, 200, "exact; count=1",
                         "httpGET127.0.0.1/blog/hello/")
        r = self.helper_get("/purge/blog/hello/feed/")
        self.assertPurge(r, 200, "exact; count=1",
                         "httpGET127.0.0.1/blog/hello/feed/")
        for feed in ("atom/", "rdf/"):
            self.assertMiss(self.helper_get("/purge/blog/hello/feed/" + feed),
                            "httpGET127.0.0.1/blog/hello/feed/" + feed)
        r = self.helper_get("/blog/hello/amp/")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("X-Cache-Status"), "HIT")
        self.assertIsNone(r.header("Cache-Purge-Result"))
        self.assertEqual(len(self.files("wordpress")), 2)
        self.page("/blog/hello/", "MISS")
        self.page("/blog/hello/feed/", "MISS")
        self.page("/blog/hello/amp/", "HIT")
        self.page("/blog/other/", "HIT")

    def test_the_amp_page_is_purged_under_the_purge_base(self):
        """The AMP page's own purge URL, as an operator sends it (nginx-
        helper's rt_nginx_helper_remote_purge_url filter may rewrite its
        AMP GET to it): only the AMP page."""
        for path in ("/blog/hello/", "/blog/hello/amp/"):
            self.page(path, "MISS")
        r = self.helper_get("/purge/blog/hello/amp/")
        self.assertPurge(r, 200, "exact; count=1",
                         "httpGET127.0.0.1/blog/hello/amp/")
        self.assertEqual(len(self.files("wordpress")), 1)
        self.page("/blog/hello/amp/", "MISS")
        self.page("/blog/hello/", "HIT")

    def test_tags_from_the_application_purge_in_fastcgi_cache(self):
        for path in ("/blog/hello/", "/blog/other/"):
            self.page(path, "MISS")
        r = self.fetch("/purge/", {"Cache-Tags": "post-1"})
        self.assertEqual(r.header("Cache-Purge-Result"), "tag; count=1")
        self.page("/blog/hello/", "MISS")
        self.page("/blog/other/", "HIT")


class NginxHelperCompatTest(NginxHelperTest):
    """The same with the fastcgi_cache_purge line nginx-helper's tutorial
    has users write: a miss is ngx_cache_purge's 412 (nginx-helper logs it
    as a WARNING, "not found ( 412 )", as it does with ngx_cache_purge)."""
    LOCATIONS = COMPAT_LOCATIONS
    MISS = 412


class SameLocationFastcgiTest(FastcgiTestCase):

    def test_purge_in_the_fastcgi_cached_location(self):
        self.page("/shop/cart", "MISS")
        self.page("/shop/cart", "HIT")
        r = self.fetch("/shop/cart", method="PURGE")
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=1")
        self.assertEqual(self.files("shop"), [])
        self.page("/shop/cart", "MISS")
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())


class SameLocationCompatTests:
    """ngx_cache_purge's "*_cache_purge PURGE from 127.0.0.1;" in a cached
    location whose *_cache_key is esi_cache_purge_key's default
    ($uri$is_args$args): purged as ngx_cache_purge would, a miss its 412,
    "on purge_all" the whole zone.  ngx_cache_purge reads the location's
    *_cache_key; this module cannot, and fastcgi, uwsgi and scgi have no
    default key as proxy has: with another *_cache_key a purge misses
    (412, the fallback key it tried in the body), the page stays, and the
    first cached answer logs both keys; naming the key in
    esi_cache_purge_key purges.  Over FastCGI here, uWSGI and SCGI in
    test_uwsgi.py: the class names the module (KIND), the cache's
    directory (ZONE) and two pages of the location."""
    MISS = 412
    ZONE, PAGE, OTHER = "shop", "/shop/cart", "/shop/other"
    PURGE_LINE = "%s_cache_purge PURGE from 127.0.0.1;"
    KEY_LINE = "%s_cache_key $uri$is_args$args;"

    def change(self, line, new):
        """The location's line (of KIND) replaced by new (of KIND)."""
        self.LOCATIONS = replaced(self.LOCATIONS, line % self.KIND,
                                  new % self.KIND)

    def test_purge_in_the_cached_location(self):
        self.assertPurgesOnly(self.ZONE, self.PAGE, self.OTHER, self.PAGE,
                              "PURGE")
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())

    def test_a_miss_is_412_and_removes_nothing(self):
        never = self.PAGE + "/never"
        self.assertMissesRemoveNothing(self.ZONE, self.PAGE, never,
                                       (never, "PURGE"))

    def test_on_purge_all_empties_the_zone(self):
        self.change(self.PURGE_LINE,
                    "%s_cache_purge on purge_all from 127.0.0.1;")
        for path in (self.PAGE, self.OTHER):
            self.page(path, "MISS")
        r = self.fetch(self.PAGE + "/any", method="PURGE")
        self.assertPurge(r, 200, "all; count=2", "")
        self.assertEqual(self.files(self.ZONE), [])
        for path in (self.PAGE, self.OTHER):
            self.page(path, "MISS")

    def test_another_cache_key_is_read_and_purged(self):
        self.change(self.KEY_LINE, '%s_cache_key "$scheme$host$request_uri";')
        self.assertPurgesOnly(self.ZONE, self.PAGE, self.OTHER, self.PAGE,
                              "PURGE", key="http127.0.0.1" + self.PAGE)
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())

    def test_that_key_named_in_esi_cache_purge_key_purges(self):
        self.change(self.KEY_LINE, '%s_cache_key "$scheme$host$request_uri";'
                    '\n            esi_cache_purge_key '
                    '"$scheme$host$request_uri";')
        self.assertPurgesOnly(self.ZONE, self.PAGE, self.OTHER, self.PAGE,
                              "PURGE", key="http127.0.0.1" + self.PAGE)
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())


class SameLocationCompatFastcgiTest(SameLocationCompatTests,
                                    FastcgiTestCase):
    LOCATIONS = COMPAT_LOCATIONS
    KIND = "fastcgi"


class KeyMismatchTest(FastcgiTestCase):
    """A same-location purge whose esi_cache_purge_key is not the cache key
    would miss on every purge: the log says so once."""
    LOCATIONS = FastcgiTestCase.LOCATIONS.replace(
        "fastcgi_cache_key $uri$is_args$args;",
        "fastcgi_cache_key \"$scheme$host$uri$is_args$args\"; "
        "esi_cache_purge_key $uri$is_args$args;")

    def test_the_first_cached_answer_names_both_keys(self):
        for status in ("MISS", "HIT", "HIT"):
            self.page("/shop/cart", status)
        log = self.error_log()
        self.assertEqual(log.count("esi_cache_purge_key gives"), 1, log)
        self.assertIn('gives "/shop/cart" where the cache key is '
                      '"http127.0.0.1/shop/cart"', log)


class UnknownZoneTest(EsiTestCase):
    ESID = False
    LOCATIONS = """
        location /purge/ {
            esi_cache_purge zone=NOWHERE key=$uri;
        }
"""

    def test_a_zone_no_cache_path_declares_stops_nginx_t(self):
        from test_limits import ConfigurationErrorTest
        code, out = ConfigurationErrorTest.nginx_t(self, "")
        self.assertNotEqual(code, 0)
        self.assertRegex(out, r'\[emerg\] no proxy_cache_path, '
                         r'fastcgi_cache_path, uwsgi_cache_path or '
                         r'scgi_cache_path declares the keys_zone "NOWHERE" '
                         r'of "esi_cache_purge" in \S+nginx\.conf:\d+\n')
