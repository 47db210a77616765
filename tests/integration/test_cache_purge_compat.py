"""ngx_cache_purge's directives (the nginx-modules fork, as Debian's
libnginx-mod-http-cache-purge documents them) on this module: an
operator's configuration works by swapping the load_module line, and gets
every Vary variant on top.  Misses are its 412, or 404 with
cache_purge_legacy_status off."""

import json

from harness import free_port, poll
from test_purge import VARY, PurgeTestCase

# the harness's "location /" has no proxy_cache_key: proxy's default
SAME = "proxy_cache_purge PURGE from 127.0.0.1;"

SEPARATE = """
        location ~ /purge(/.*) {
            allow 127.0.0.1;
            deny all;
            proxy_cache_purge pages http://127.0.0.1:@@ORIGIN@@$1$is_args$args;
        }
"""


class CompatTestCase(PurgeTestCase):
    LOCATION = SAME
    LOCATIONS = SEPARATE

    def stored(self, path="/p"):
        """path cached in two Vary variants."""
        before = len(self.cache_files())
        self.origin.route(path, "body", headers=VARY)
        for variant in ("a", "b"):
            self.assertEqual(self.cache_status(path, variant), "MISS")
        # NGINX renames a cache file into place once the upstream is done,
        # which may be after the client has its answer (bounded wait)
        poll(lambda: len(self.cache_files()) == before + 2)
        self.assertEqual(len(self.cache_files()), before + 2)


    def assertMissRemovesNothing(self, purge, status, key):
        """/p stored in two variants, `purge` (a request) finds nothing:
        status, count=0 and the key it tried in the body; both files kept,
        both variants still HITs."""
        self.stored()
        before = self.cache_files()
        r = purge()
        self.assertPurged(r, status, "exact; count=0")
        self.assertIn(b"<h1>Not cached</h1>", r.body)
        self.assertIn(("Key: %s</p>" % key).encode(), r.body)
        self.assertEqual(self.cache_files(), before)
        for variant in ("a", "b"):
            self.assertEqual(self.cache_status("/p", variant), "HIT")

    def where(self, text):
        """nginx.conf and the number of the line that holds text."""
        conf = self.tmp + "/nginx.conf"
        with open(conf) as f:
            lines = f.read().splitlines()
        return conf, 1 + next(i for i, l in enumerate(lines) if text in l)

    @property
    def default_key(self):
        """proxy's default key of the harness's location /, to a path"""
        return "http://127.0.0.1:%d" % self.origin.port


class SameLocationCompatTest(CompatTestCase):

    def test_purge_with_proxys_default_key_removes_every_variant(self):
        self.stored()
        r = self.purge("/p")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/p", "a"), "MISS")
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())

    def test_a_miss_is_412_and_removes_nothing(self):
        self.assertMissRemovesNothing(lambda: self.purge("/never"), 412,
                                      self.default_key + "/never")

    def test_other_methods_are_not_purges(self):
        self.stored()
        r = self.fetch("/p", method="BAN")      # the origin's answer
        self.assertIsNone(r.header("Cache-Purge-Result"))
        self.assertEqual(len(self.cache_files()), 2)


class SeparateLocationCompatTest(CompatTestCase):

    def test_zone_and_key_in_a_location_of_their_own(self):
        self.stored()
        r = self.fetch("/purge/p")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=2")
        self.assertEqual(self.cache_files(), [])

    def test_a_miss_there_is_412_and_removes_nothing(self):
        self.assertMissRemovesNothing(lambda: self.fetch("/purge/never"),
                                      412, self.default_key + "/never")


class HttpsUpstreamCompatTest(CompatTestCase):
    """proxy's default key begins with proxy_pass's scheme: a location
    whose upstream is https purges https:// keys, and an http location
    beside it, which since NGINX 1.23 shares an ngx_ssl_t with it (the
    proxy_ssl_* settings are inherited), still purges http:// ones.  The
    https upstream is this nginx's own TLS server in front of the origin."""
    HTTP = """
    server {
        listen 127.0.0.1:@@TLS_PORT@@ ssl;
        ssl_certificate @@TMP@@/cert.pem;
        ssl_certificate_key @@TMP@@/key.pem;
        location / {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }
    }
"""
    LOCATIONS = """
        location /tls/ {
            proxy_pass https://127.0.0.1:@@TLS_PORT@@;
            proxy_cache pages;
            proxy_cache_valid 200 10m;
            add_header X-Cache-Status $upstream_cache_status;
            proxy_cache_purge PURGE from 127.0.0.1;
        }
"""

    def setUp(self):
        super().setUp()
        self.make_certificate()
        tls_port = free_port()
        self.HTTP = self.HTTP.replace("@@TLS_PORT@@", str(tls_port))
        self.LOCATIONS = self.LOCATIONS.replace("@@TLS_PORT@@",
                                                str(tls_port))

    def test_an_https_upstreams_default_key_is_purged(self):
        self.stored("/tls/p")
        r = self.purge("/tls/p")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=2")
        self.assertEqual(self.cache_files(), [])
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())

    def test_an_http_upstream_beside_it_purges_http_keys(self):
        self.stored("/tls/p")
        self.stored("/p")
        r = self.purge("/p")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Result"), "exact; count=2")
        self.assertEqual(len(self.cache_files()), 2)
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())


class LegacyStatusOffTest(CompatTestCase):
    HTTP = "cache_purge_legacy_status off;"

    def test_a_miss_is_404_and_removes_nothing(self):
        self.assertMissRemovesNothing(lambda: self.purge("/never"), 404,
                                      self.default_key + "/never")


class OnAndPurgeAllTest(CompatTestCase):
    LOCATION = "proxy_cache_purge on purge_all from 127.0.0.1;"
    HTTP = "cache_purge_response_type json;"

    def test_on_is_purge_and_purge_all_empties_the_zone(self):
        self.stored("/p")
        self.stored("/q")
        r = self.purge("/p")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Content-Type"), "application/json")
        self.assertEqual(r.header("Cache-Purge-Result"), "all; count=4")
        self.assertEqual(json.loads(r.body), {
            "Key": "", "Status": "purged",
            "status": "purged", "kind": "all", "key": "", "count": 4,
            "soft": False})
        self.assertEqual(self.cache_files(), [])
        self.assertEqual(self.cache_status("/q", "a"), "MISS")


class OffTest(CompatTestCase):
    LOCATION = "proxy_cache_purge off;"

    def test_off_purges_nothing(self):
        """PURGE goes to the origin as any method would: its answer (the
        stdlib server's 501 to a method it has no handler for), no
        Cache-Purge-Result, both files kept and both variants HITs."""
        self.stored()
        before = self.cache_files()
        r = self.purge("/p")
        self.assertEqual(r.status, 501, r.body)
        self.assertIn(b"Unsupported method ('PURGE')", r.body)
        self.assertIsNone(r.header("Cache-Purge-Result"))
        self.assertEqual(self.cache_files(), before)
        for variant in ("a", "b"):
            self.assertEqual(self.cache_status("/p", variant), "HIT")


class ConfigurationTest(CompatTestCase):
    ESID = False

    def nginx_t(self, location):
        from test_limits import ConfigurationErrorTest
        return ConfigurationErrorTest.nginx_t(self, location)

    def test_both_forms_and_bad_ones(self):
        for good in ("proxy_cache_purge on;", "proxy_cache_purge PURGE;",
                     "proxy_cache_purge PURGE purge_all from all;"):
            code, out = self.nginx_t(good)
            self.assertEqual(code, 0, good + "\n" + out)
        usage = ('"%s" directive must be "on|off|METHOD [purge_all] [from '
                 'all|ADDRESS ...]" or "ZONE KEY" in ')
        for bad, emerg in (
                ("proxy_cache_purge purge from all;",
                 'invalid method "purge" in '),
                ("proxy_cache_purge PURGE from;",
                 usage % "proxy_cache_purge"),
                ("fastcgi_cache_purge PURGE from;",
                 usage % "fastcgi_cache_purge"),
                ("proxy_cache_purge PURGE to 127.0.0.1;",
                 usage % "proxy_cache_purge"),
                ("proxy_cache_purge PURGE from 300.1.1.1;",
                 'invalid address "300.1.1.1" in '),
                ("proxy_cache_purge off now later;",
                 '"proxy_cache_purge" directive takes nothing after off '
                 'in '),
                # two words after the directive are ZONE KEY, as
                # ngx_cache_purge reads them: a zone "off" nothing declares
                ("proxy_cache_purge off now;",
                 'no proxy_cache_path, fastcgi_cache_path, uwsgi_cache_path '
                 'or scgi_cache_path declares the keys_zone "off" of '
                 '"proxy_cache_purge" in ')):
            code, out = self.nginx_t(bad)
            self.assertNotEqual(code, 0, bad)
            self.assertEqual(
                [l for l in out.splitlines() if "[emerg]" in l],
                ["nginx: [emerg] " + emerg + (
                    "%s:%d" % self.where(bad) if emerg.endswith(" in ")
                    else "")], bad)


    def test_ngx_cache_purge_3s_settings_and_their_errors(self):
        """its queue settings are accepted (they have no work here), with
        its errors for bad values"""
        self.HTTP = ("cache_purge_background_queue on; "
                     "cache_purge_queue_size 2048; cache_purge_batch_size 20; "
                     "cache_purge_throttle_ms 25ms; "
                     "cache_purge_vary_aware off; "
                     "cache_purge_response_type json;")
        code, out = self.nginx_t(SAME)
        self.assertEqual(code, 0, out)
        for http, location, emerg in (
                ("cache_purge_queue_size -1;", SAME,
                 '"cache_purge_queue_size" directive invalid number in '),
                ("cache_purge_batch_size many;", SAME,
                 '"cache_purge_batch_size" directive invalid number in '),
                ("", "cache_purge_response_type invalid;" + SAME,
                 'invalid parameter "invalid", expected "html", "json", '
                 '"xml" or "text" in ')):
            self.HTTP = http
            code, out = self.nginx_t(location)
            bad = http or location
            self.assertNotEqual(code, 0, bad)
            self.assertEqual(
                [l for l in out.splitlines() if "[emerg]" in l],
                ["nginx: [emerg] %s%s:%d" % ((emerg,) + self.where(
                    bad.split(";")[0]))], bad)


class BackgroundQueueTest(CompatTestCase):
    """cache_purge_background_queue on: a wildcard and purge_all are
    answered as ngx_cache_purge 3.0 answers what it queues, 202 "queued",
    found or not; here esid has carried them out by then, and
    Cache-Purge-Result says what went.  An exact purge is answered as
    always."""
    HTTP = "cache_purge_background_queue on;"

    def test_a_wildcard_is_answered_queued_and_done(self):
        self.stored("/p")
        r = self.purge("/p*")
        self.assertPurged(r, 202, "wildcard; count=2")
        self.assertIn(("<p>Key: %s/p*</p><p>Status: queued</p>"
                       % self.default_key).encode(), r.body)
        self.assertEqual(self.cache_files(), [])
        self.assertPurged(self.purge("/p*"), 202, "wildcard; count=0")

    def test_an_exact_purge_is_answered_as_always(self):
        self.stored("/p")
        r = self.purge("/p")
        self.assertPurged(r, 200, "exact; count=2")
        self.assertIn(("<p>Key: %s/p</p><p>Status: purged</p>"
                       % self.default_key).encode(), r.body)
        self.assertPurged(self.purge("/p"), 412, "exact; count=0")


class OpenPurgeWarningTest(CompatTestCase):
    """Purges open by accident (issue 33, item 4), said by `nginx -t` as
    a [warn]: ngx_cache_purge's `on` or METHOD without `from` (any address
    purges, its meaning, kept), and servers of different names sharing a
    zone whose purge key names no host (a purge in one removes the other's
    objects).  Safe configurations print no [warn] at all."""
    ESID = False
    LOCATIONS = ""

    OPEN = ('[warn] "%s" without "from" lets any address purge: add "from '
            '127.0.0.1" (the addresses that purge) or an allow list, or say '
            '"from all", in location "%s" in %s:%d')

    SHARED = ('[warn] servers "other.example", "localhost" share the cache '
              'zone "pages", and the purge key "%s" of location "%s" in '
              'server "%s" names no $host: a purge in one server '
              'removes what the others cache under the same key; put $host '
              'in the cache key and in esi_cache_purge_key, or give each '
              'server a keys_zone of its own')

    # another server, on the harness's zone unless it says, its location /
    # purging (on another address: a name of the harness's server does not
    # conflict)
    OTHER = """
    server {
        listen 127.0.0.2:@@PORT@@;
        server_name %s;
        location / {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache %s;
            %s
        }
    }
"""

    APPS = """
    fastcgi_cache_path @@TMP@@/fastcgi keys_zone=fastcgi:1m;
    uwsgi_cache_path @@TMP@@/uwsgi keys_zone=uwsgi:1m;
    scgi_cache_path @@TMP@@/scgi keys_zone=scgi:1m;
"""

    def nginx_t(self, location):
        from test_limits import ConfigurationErrorTest
        return ConfigurationErrorTest.nginx_t(self, location)

    def warnings(self, out):
        return [line for line in out.splitlines() if "[warn]" in line]

    def test_a_purge_without_from_is_warned_with_its_location(self):
        for directive in ("proxy_cache_purge on;", "proxy_cache_purge PURGE;",
                          "proxy_cache_purge on purge_all;"):
            code, out = self.nginx_t(directive)
            self.assertEqual(code, 0, out)
            self.assertEqual(self.warnings(out), [
                "nginx: " + self.OPEN % (("proxy_cache_purge", "/")
                                         + self.where(directive))])

    def test_fastcgi_uwsgi_and_scgi_alike(self):
        self.HTTP = self.APPS
        for app in ("fastcgi", "uwsgi", "scgi"):
            directive = "%s_cache_purge on;" % app
            self.LOCATIONS = """
        location /%s/ {
            %s_pass 127.0.0.1:9;
            %s_cache %s;
            %s_cache_key $uri;
            %s
        }
""" % (app, app, app, app, app, directive)
            code, out = self.nginx_t("")
            self.assertEqual(code, 0, out)
            self.assertEqual(self.warnings(out), [
                "nginx: " + self.OPEN % (("%s_cache_purge" % app,
                                          "/%s/" % app)
                                         + self.where(directive))])

    def test_a_purge_with_from_prints_no_warning(self):
        for directive in ("proxy_cache_purge PURGE from 127.0.0.1;",
                          "proxy_cache_purge on from all;",
                          "esi_cache_purge PURGE from 127.0.0.1;"):
            code, out = self.nginx_t(directive)
            self.assertEqual(code, 0, out)
            self.assertEqual(self.warnings(out), [], directive)

    def assertShared(self, other, here, key, where=("/", "other.example")):
        """other.example on the harness's zone, its location / with other,
        the harness's with here: one [warn], naming key and where it is."""
        self.HTTP = self.OTHER % ("other.example", "pages", other)
        code, out = self.nginx_t(here)
        self.assertEqual(code, 0, out)
        self.assertEqual(self.warnings(out),
                         ["nginx: " + self.SHARED % ((key,) + where)])

    def test_servers_sharing_a_zone_without_host_in_the_key_are_warned(self):
        key = "proxy_cache_key $uri$is_args$args; " \
              "esi_cache_purge_key $uri$is_args$args; "
        self.assertShared(key + "esi_cache_purge PURGE from all;",
                          key + "esi_cache_purge PURGE from 127.0.0.1;",
                          "$uri$is_args$args")

    def test_proxys_default_key_names_no_host_either(self):
        self.assertShared("proxy_cache_purge PURGE from all;",
                          "proxy_cache_purge PURGE from 127.0.0.1;",
                          "http://127.0.0.1:%d$request_uri"
                          % self.origin.port)

    def test_a_caching_server_shares_the_zone_with_a_purging_one(self):
        self.assertShared("esi_cache_purge PURGE from all;", "",
                          "$uri$is_args$args")

    def test_a_purge_location_of_its_own_counts(self):
        self.LOCATIONS = """
        location /purge/ {
            esi_cache_purge zone=pages key=$uri;
        }
"""
        self.assertShared("", "", "$uri", ("/purge/", "localhost"))

    def test_hostname_is_no_host(self):
        self.assertShared("proxy_cache_key $uri; "
                          "esi_cache_purge_key $hostname$uri; "
                          "esi_cache_purge PURGE from all;", "",
                          "$hostname$uri")

    def test_a_host_in_the_key_one_server_or_a_zone_each_print_nothing(self):
        host = "proxy_cache_key $host$uri$is_args$args; " \
               "esi_cache_purge_key ${http_host}$uri$is_args$args; "
        no_host = "proxy_cache_key $uri; esi_cache_purge_key $hostname$uri; "
        for name, zone, other, here in (
                ("other.example", "pages",
                 host + "esi_cache_purge PURGE from all;",
                 host + "esi_cache_purge PURGE from 127.0.0.1;"),
                ("localhost", "pages",
                 no_host + "esi_cache_purge PURGE from all;",
                 no_host + "esi_cache_purge PURGE from 127.0.0.1;"),
                ("other.example", "own",
                 no_host + "esi_cache_purge PURGE from all;",
                 no_host + "esi_cache_purge PURGE from 127.0.0.1;")):
            self.HTTP = "proxy_cache_path @@TMP@@/own keys_zone=own:1m;" \
                + self.OTHER % (name, zone, other)
            code, out = self.nginx_t(here)
            self.assertEqual(code, 0, out)
            self.assertEqual(self.warnings(out), [], self.HTTP)


class OwnCacheKeyTest(CompatTestCase):
    """ngx_cache_purge's README sets proxy_cache_key: the purge removes
    what NGINX stored under it, with no other line, whether the location
    sets it or inherits it."""
    LOCATION = """
            proxy_cache_key $uri$is_args$args;
            proxy_cache_purge PURGE from 127.0.0.1;
"""

    def assertOwnKeyPurged(self):
        self.stored()
        r = self.purge("/p")
        self.assertPurged(r, 200, "exact; count=2")
        self.assertIn(b"Key: /p</p>", r.body)
        self.assertEqual(self.cache_files(), [])
        self.assertNotIn("esi_cache_purge_key gives", self.error_log())

    def test_the_locations_key_is_purged(self):
        self.assertOwnKeyPurged()

    def test_a_key_inherited_from_the_server_is_purged(self):
        self.SERVER = "proxy_cache_key $uri$is_args$args;"
        self.LOCATION = SAME
        self.assertOwnKeyPurged()

    def test_esi_cache_purge_key_still_overrides_it(self):
        self.LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge_key $uri$is_args$args-other;
            proxy_cache_purge PURGE from 127.0.0.1;
"""
        self.stored()
        self.assertPurged(self.purge("/p"), 412, "exact; count=0")
        self.assertIn('esi_cache_purge_key gives "/p-other" where the cache '
                      'key is "/p"', self.error_log())
