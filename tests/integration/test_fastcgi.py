"""ESI and purge over a FastCGI application in fastcgi_cache: a real
FastCGI server (Debian's fcgiwrap running a CGI script), pages assembled and
planned as over proxy_cache, and purged as WordPress' nginx-helper purges
them (GET /purge/<path> through a location of its own whose key is the
cache key, "$scheme$request_method$host$1") and with PURGE in the cached
location itself."""

import os
import shutil
import stat

from harness import DidNotStart, EsiTestCase, start_on_socket

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

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/a", "A", content_type="text/plain")

    def files(self, zone):
        found = []
        for root, _, names in os.walk(os.path.join(self.tmp, zone)):
            found += [n for n in names if len(n) == 32]
        return found

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


class FastcgiEsiTest(FastcgiTestCase):

    def test_pages_from_fastcgi_cache_are_assembled_and_planned(self):
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.page("/blog/hello/", status)
        self.assertGreaterEqual(self.stats_json()["planned"], 1)


class NginxHelperTest(FastcgiTestCase):
    """nginx-helper (ngx_cache_purge mode): GET /purge/<path>, also for the
    feed and AMP forms; 200 is purged, 404 not cached."""

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

    def test_a_page_not_cached_is_404(self):
        r = self.fetch("/purge/blog/never/")
        self.assertEqual(r.status, 404)

    def test_tags_from_the_application_purge_in_fastcgi_cache(self):
        for path in ("/blog/hello/", "/blog/other/"):
            self.page(path, "MISS")
        r = self.fetch("/purge/", {"Cache-Tags": "post-1"})
        self.assertEqual(r.header("Cache-Purge-Result"), "tag; count=1")
        self.page("/blog/hello/", "MISS")
        self.page("/blog/other/", "HIT")


class SameLocationFastcgiTest(FastcgiTestCase):

    def test_purge_in_the_fastcgi_cached_location(self):
        self.page("/shop/cart", "MISS")
        self.page("/shop/cart", "HIT")
        r = self.fetch("/shop/cart", method="PURGE")
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=1")
        self.assertEqual(self.files("shop"), [])
        self.page("/shop/cart", "MISS")
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())


class KeyMismatchTest(FastcgiTestCase):
    """A same-location purge whose esi_cache_purge_key is not the cache key
    would miss on every purge: the log says so once."""
    LOCATIONS = FastcgiTestCase.LOCATIONS.replace(
        "fastcgi_cache_key $uri$is_args$args;",
        "fastcgi_cache_key \"$scheme$host$uri$is_args$args\";")

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
        self.assertIn('"esi_cache_purge zone=NOWHERE": no proxy_cache_path',
                      out)
