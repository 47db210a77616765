"""ESI and purge over uwsgi_cache and scgi_cache: a real uWSGI (Debian's
uwsgi-core with its python3 plugin) serving a small WSGI application over
the uwsgi protocol and over SCGI; pages assembled and planned as over
proxy_cache, purged exactly, by tag and by tag pattern with PURGE in the
cached location, and with esictl purge."""

import json
import os
import shutil

from harness import DidNotStart, start_on_port
from test_fastcgi import AppCacheTestCase, SameLocationCompatTests

# Each page: its path and an include; tagged as a blog's posts are.
APP = r"""
def application(environ, start_response):
    # Debian's scgi_params passes DOCUMENT_URI, no PATH_INFO
    path = environ.get("PATH_INFO") or environ["DOCUMENT_URI"]
    tag = "post-1" if path.startswith("/app/hello") else "post-2"
    start_response("200 OK", [("Content-Type", "text/html"),
                              ("Cache-Tags", tag + ",blog")])
    return [("<p>%s</p><esi:include src=\"/esi/a\"/>" % path).encode()]
"""

LOCATION = """
        location /app/ {
            include /etc/nginx/%(kind)s_params;
            %(kind)s_pass 127.0.0.1:%(port)d;
            %(kind)s_cache APP;
            %(kind)s_cache_valid 200 10m;
            %(kind)s_cache_key $uri$is_args$args;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
            esi_cache_purge PURGE from 127.0.0.1;
        }
"""


# ngx_cache_purge's own lines, kept as an operator moving from it keeps them:
# PURGE in the cached location and the ZONE KEY form in one of its own
COMPAT_LOCATION = LOCATION.replace(
    "esi_cache_purge PURGE from 127.0.0.1;",
    "%(kind)s_cache_purge PURGE from 127.0.0.1;") + """
        location ~ /purge(/.*) {
            allow 127.0.0.1;
            deny all;
            %(kind)s_cache_purge APP $1$is_args$args;
        }
"""


class UwsgiAppTestCase(AppCacheTestCase):
    """The WSGI application in uWSGI behind LOCATION's /app/."""
    KIND = "uwsgi"              # the NGINX module: uwsgi or scgi
    SOCKET = "--uwsgi-socket"   # uWSGI's listener for that protocol
    TEMPLATE = LOCATION         # the locations, of kind and port

    def setUp(self):
        super().setUp()
        app = os.path.join(self.tmp, "app.py")
        with open(app, "w") as f:
            f.write(APP)
        tool = shutil.which("uwsgi") or "/usr/bin/uwsgi"

        def start(port):
            return self.spawn("uwsgi-%d" % port, [
                tool, "--plugin", "python3", self.SOCKET,
                "127.0.0.1:%d" % port, "--wsgi-file", app, "--need-app",
                "--die-on-term", "--processes", "1"])

        try:
            _, port = start_on_port(start)
        except DidNotStart as e:
            self.fail("uwsgi did not start:\n%s" % e.log)
        self.HTTP = "%s_cache_path %s keys_zone=APP:16m;" % (
            self.KIND, os.path.join(self.tmp, "app"))
        self.LOCATIONS = self.TEMPLATE % {"kind": self.KIND, "port": port}


class UwsgiTestCase(UwsgiAppTestCase):

    def test_pages_are_assembled_and_planned(self):
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.page("/app/hello", status)
        self.assertGreaterEqual(self.stats_json()["planned"], 1)

    def test_purge_of_a_key_removes_the_page_and_only_it(self):
        for path in ("/app/hello", "/app/other"):
            self.page(path, "MISS")
        r = self.fetch("/app/hello", method="PURGE")
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=1")
        self.assertEqual(len(self.files("app")), 1)
        self.page("/app/hello", "MISS")
        self.page("/app/other", "HIT")

    def test_purge_by_the_applications_tag(self):
        for path in ("/app/hello", "/app/hello/2", "/app/other"):
            self.page(path, "MISS")
        r = self.fetch("/app/", {"Cache-Tags": "post-1"}, method="PURGE")
        self.assertEqual(r.header("Cache-Purge-Result"), "tag; count=2")
        self.page("/app/hello", "MISS")
        self.page("/app/hello/2", "MISS")
        self.page("/app/other", "HIT")

    def test_esictl_purges_by_key_and_by_pattern(self):
        for path in ("/app/hello", "/app/other", "/app/more"):
            self.page(path, "MISS")
        r = self.esictl("purge", "APP", "/app/more", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(json.loads(r.stdout)["count"], 1)
        r = self.esictl("purge", "APP", "^post-1,", "--pattern", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(json.loads(r.stdout)["count"], 1)
        self.assertEqual(len(self.files("app")), 1)
        self.page("/app/hello", "MISS")
        self.page("/app/other", "HIT")


class ScgiTest(UwsgiTestCase):
    KIND = "scgi"
    SOCKET = "--scgi-socket"


class UwsgiCompatTest(SameLocationCompatTests, UwsgiAppTestCase):
    """ngx_cache_purge's uwsgi_cache_purge (scgi_cache_purge in
    ScgiCompatTest) as its README writes it, in both forms."""
    TEMPLATE = COMPAT_LOCATION
    KIND = "uwsgi"
    ZONE, PAGE, OTHER = "app", "/app/hello", "/app/other"

    def test_zone_and_key_in_a_location_of_their_own(self):
        self.assertPurgesOnly("app", "/app/hello", "/app/other",
                              "/purge/app/hello")

    def test_a_miss_there_is_412_and_removes_nothing(self):
        self.assertMissesRemoveNothing("app", "/app/hello", "/app/never",
                                       ("/purge/app/never", "GET"))


class ScgiCompatTest(UwsgiCompatTest):
    KIND = "scgi"
    SOCKET = "--scgi-socket"
