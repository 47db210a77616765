"""HTTP/3 (issue #32): NGINX's QUIC listener (`listen PORT quic`, `http3
on`) on the UDP port of the same number as the TCP one, so that an HTTP/3
client's :authority is the Host an HTTP/1.1 client sends, and Debian's
ngtcp2 client against it (esitest.h3).  Every request is made over HTTP/1.1
and over HTTP/3 and the answers compared byte for byte: pages assembled,
$(HTTP_HOST) and includes naming the page's own authority (an HTTP/3
request has :authority and no Host header), cookies sent as several
fields, gzip stitching, planned hits, and every purge form, each purge
leaving the same cache behind.

Where nginx has no HTTP/3 (Debian 12's 1.22: no --with-http_v3_module in
`nginx -V`) every test skips with "nginx without HTTP/3"; with
ESI_EXPECT_HTTP3=1 that is a failure instead.
"""

from harness import ERROR_MARKER, EsiTestCase
from test_cache_purge_compat import SAME as COMPAT_SAME
from test_cache_purge_compat import SEPARATE as COMPAT_SEPARATE
from test_plan import PlanTestCase
from test_plan import assembled as plan_assembled
from test_plan import page as plan_page
from test_purge import SAME_LOCATION, SEPARATE_LOCATION, VARY, PurgeTestCase
from test_stitch import (GZIP, StitchTestCase, gunzip, page, runs_of,
                         segment)
from test_stitch import assembled as stitch_assembled

BOTH = (False, True)        # http3: over HTTP/1.1, then over HTTP/3

# What a response means, beside its status and body; framing fields
# (Content-Length, Transfer-Encoding, Connection) and Date are the
# protocol's and the clock's.
MEANING = ("Content-Type", "Content-Encoding", "Vary", "X-Cache-Status",
           "Cache-Purge-Result", "ETag", "Last-Modified")


def protocol(http3):
    return "HTTP/3" if http3 else "HTTP/1.1"


class Http3Mixin:
    HTTP3 = True

    def answer(self, path, headers=None, method="GET", http3=False):
        """(status, the MEANING fields, body) of one complete request."""
        r = self.fetch(path, headers, method, http3=http3)
        self.assertTrue(r.complete, "%s %s over %s: %r" % (
            method, path, protocol(http3), r))
        fields = {name: r.header(name) for name in MEANING
                  if r.header(name) is not None}
        if "Vary" in fields:
            # NGINX's HTTP/3 sends gzip_vary's Vary as QPACK's static
            # entry, "vary: accept-encoding": the token in lower case
            fields["Vary"] = fields["Vary"].lower()
        return r.status, fields, r.body

    def assertSameOverBoth(self, path, body, headers=None, status=200,
                           http3_headers=None):
        """path asked over HTTP/1.1, then over HTTP/3 (with http3_headers
        when its fields are spelt otherwise): both answer status and body,
        with the same fields but X-Cache-Status (the first may store the
        page the second finds).  Returns the HTTP/3 answer."""
        one = self.answer(path, headers)
        three = self.answer(path, http3_headers or headers, http3=True)
        self.assertEqual(one[2], body, "body over HTTP/1.1")
        self.assertEqual(three[2], body, "body over HTTP/3")
        self.assertEqual(one[0], status)
        for answer in (one, three):
            answer[1].pop("X-Cache-Status", None)
        self.assertEqual(three[0:2], one[0:2], "status and fields")
        return three

    def server_protocols(self, count):
        """$server_protocol of the first `count` requests."""
        return [line.split()[1] for line in self.access_log(count,
                                                            "proto.log")]


PROTOCOL_LOG = """
    log_format proto '$request_uri $server_protocol $esi_status';
    access_log @@TMP@@/proto.log proto;
"""


class PageTest(Http3Mixin, EsiTestCase):
    HTTP = PROTOCOL_LOG
    LOCATION = "esi_cookies user group;"

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", 'X<esi:include src="/esi/y"/>')
        self.origin.route("/esi/y", "Y")

    def test_a_page_with_nested_includes_is_assembled_over_http3(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.assertSameOverBoth("/page", b"aXYc")
        self.assertEqual(self.server_protocols(2), ["HTTP/1.1", "HTTP/3.0"])
        self.assertEqual(self.access_log(2, "proto.log")[1].split()[2],
                         "processed")

    def test_http_host_is_the_authority_the_client_named(self):
        self.origin.route("/page", "<esi:vars>[$(HTTP_HOST)]</esi:vars>")
        self.start()
        self.assertSameOverBoth("/page", ("[%s]" % self.host).encode())

    def test_an_include_naming_the_pages_own_authority_is_fetched(self):
        self.start()
        self.origin.route("/page", 'a<esi:include src="https://%s/esi/x"/>'
                          '<esi:include src="http://%s/esi/y"/>c' % (
                              self.host, self.host))
        self.assertSameOverBoth("/page", b"aXYYc")

    def test_an_include_naming_another_authority_is_refused_alike(self):
        self.origin.route("/page", 'a<esi:include src="https://127.0.0.1:'
                          '1/esi/x"/>c')
        self.assertSameOverBoth("/page", b"a" + ERROR_MARKER + b"c")

    def test_cookies_sent_as_several_fields_are_read_together(self):
        # HTTP/3 clients send each cookie in a field of its own (RFC 9114,
        # 4.2.1); NGINX joins them into one Cookie header
        self.origin.route("/page", "<esi:vars>[$(HTTP_COOKIE{user})/"
                          "$(HTTP_COOKIE{group})/$(HTTP_COOKIE{secret})]"
                          "</esi:vars>")
        self.assertSameOverBoth(
            "/page", b"[ann/gold/]",
            headers={"Cookie": "user=ann; secret=s3; group=gold"},
            http3_headers=[("Cookie", "user=ann"), ("Cookie", "secret=s3"),
                           ("Cookie", "group=gold")])

    def test_request_headers_and_query_mean_the_same(self):
        self.origin.route("/page", "<esi:vars>[$(QUERY_STRING)|"
                          "$(HTTP_USER_AGENT)|$(HTTP_REFERER)|"
                          "$(HTTP_ACCEPT_LANGUAGE)]</esi:vars>")
        fields = {"User-Agent": "agent/1", "Referer": "http://r/",
                  "Accept-Language": "da, en-gb;q=0.8"}
        self.assertSameOverBoth("/page?a=1&b=2",
                                b"[a=1&amp;b=2|agent/1|http://r/|"
                                b"da, en-gb;q=0.8]", fields)


class PlanTest(Http3Mixin, PlanTestCase):

    def test_a_planned_hit_is_replayed_over_http3(self):
        body = plan_page()
        self.origin.route("/p", body)
        expected = plan_assembled(body).encode()
        self.hit("/p", plan_assembled(body), "MISS")
        self.hit("/p", plan_assembled(body))        # parsed, plan recorded
        self.assertEqual(self.counters()[0], 0)
        self.assertSameOverBoth("/p", expected)
        self.assertEqual(self.counters()[0], 2)
        for _ in range(2):
            self.assertEqual(self.answer("/p", http3=True)[2], expected)
        self.assertEqual(self.counters()[0], 4)

    def test_a_page_planned_over_http3_replays_over_http11(self):
        body = plan_page(filler=20000)      # several buffers of the file
        self.origin.route("/big", body)
        expected = plan_assembled(body).encode()
        for status in ("MISS", "HIT", "HIT"):
            _, fields, got = self.answer("/big", http3=True)
            self.assertEqual((fields["X-Cache-Status"], got),
                             (status, expected))
        self.assertEqual(self.counters()[0], 1)
        self.assertSameOverBoth("/big", expected)
        self.assertEqual(self.counters()[0], 3)


class StitchTest(Http3Mixin, StitchTestCase):

    def test_a_gzip_client_gets_the_same_stitched_gzip_over_http3(self):
        runs = runs_of("h3")
        body = page(runs)
        plain = stitch_assembled(body).encode()
        self.origin.route("/p", body)
        for status in ("MISS", "HIT"):      # the hit records the plan
            self.assertEqual(gunzip(self.gz("/p", status)), plain)
        one = self.answer("/p", GZIP)
        three = self.answer("/p", GZIP, http3=True)
        self.assertEqual(three, one)
        self.assertEqual(three[1]["Content-Encoding"], "gzip")
        self.assertEqual(gunzip(three[2]), plain)
        for run in runs:
            if len(run) >= 128:
                self.assertIn(segment(run), three[2])
        self.assertEqual(self.stats_json()["planned"], 2)

    def test_a_plain_client_gets_the_plain_page_over_http3(self):
        body = page(runs_of("plain"))
        self.warm("/p", body)
        self.assertSameOverBoth("/p", stitch_assembled(body).encode())


class SameLocationPurgeTest(Http3Mixin, PurgeTestCase):
    LOCATION = SAME_LOCATION

    def store_variants(self, http3, path="/v"):
        self.origin.route(path, "variant body", headers=VARY)
        for variant, status in (("a", "MISS"), ("b", "MISS"), ("a", "HIT")):
            self.assertEqual(self.answer(path, {"X-Variant": variant},
                                         http3=http3)[1]["X-Cache-Status"],
                             status)

    def purged_over_both(self, store, path, headers=None, method="PURGE"):
        """store(http3), then the purge, over HTTP/1.1 and then over
        HTTP/3: the same answer and the same cache files left."""
        results = []
        for http3 in BOTH:
            store(http3)
            answer = self.answer(path, headers, method, http3)
            results.append((answer, [f.rsplit("/", 1)[1]
                                     for f in self.cache_files()]))
        self.assertEqual(results[1], results[0])
        return results[1]

    def test_purge_removes_every_vary_variant(self):
        (status, fields, body), left = self.purged_over_both(
            self.store_variants, "/v")
        self.assertEqual((status, fields["Cache-Purge-Result"], left),
                         (200, "exact; count=2", []))
        self.assertIn(b"Successful purge", body)
        self.assertEqual(self.answer("/v", {"X-Variant": "a"}, http3=True)
                         [1]["X-Cache-Status"], "MISS")

    def test_a_purge_of_nothing_cached_is_404(self):
        (status, fields, _), _ = self.purged_over_both(lambda http3: None,
                                                       "/never")
        self.assertEqual((status, fields["Cache-Purge-Result"]),
                         (404, "exact; count=0"))

    def test_a_tag_purge_removes_every_object_with_the_tag(self):
        def store(http3):
            self.origin.route("/t/1", "1", headers=[("Surrogate-Key",
                                                     "p1 p2")])
            self.origin.route("/t/2", "2", headers=[("xkey", "p1")])
            self.origin.route("/t/3", "3", headers=[("Surrogate-Key", "p3")])
            for path in ("/t/1", "/t/2", "/t/3"):
                self.answer(path, http3=http3)
            self.assertEqual(len(self.cache_files()), 3)
        (status, fields, _), left = self.purged_over_both(
            store, "/anything", {"Surrogate-Key": "p1"})
        self.assertEqual((status, fields["Cache-Purge-Result"], len(left)),
                         (200, "tag; count=2", 1))


class SeparateLocationPurgeTest(SameLocationPurgeTest):
    LOCATION = "proxy_cache_key $uri$is_args$args;"
    LOCATIONS = SEPARATE_LOCATION

    def test_purge_removes_every_vary_variant(self):
        (status, fields, _), left = self.purged_over_both(
            self.store_variants, "/purge/v", method="GET")
        self.assertEqual((status, fields["Cache-Purge-Result"], left),
                         (200, "exact; count=2", []))

    def test_a_wildcard_removes_the_keys_with_its_prefix(self):
        def store(http3):
            for path in ("/shop/a", "/shop/b", "/blog/c"):
                self.origin.route(path, path)
                self.answer(path, http3=http3)
        (status, fields, _), left = self.purged_over_both(
            store, "/purge/shop*", method="GET")
        self.assertEqual((status, fields["Cache-Purge-Result"], len(left)),
                         (200, "wildcard; count=2", 1))

    test_a_purge_of_nothing_cached_is_404 = None
    test_a_tag_purge_removes_every_object_with_the_tag = None


class CachePurgeCompatTest(SameLocationPurgeTest):
    """ngx_cache_purge's forms: proxy_cache_purge in the cached location
    (proxy's default key) and ZONE KEY in a location of its own."""
    LOCATION = COMPAT_SAME
    LOCATIONS = COMPAT_SEPARATE

    def test_purge_removes_every_vary_variant(self):
        (status, fields, _), left = self.purged_over_both(
            self.store_variants, "/v")
        self.assertEqual((status, fields["Cache-Purge-Result"], left),
                         (200, "exact; count=2", []))

    def test_zone_and_key_in_a_location_of_their_own(self):
        (status, fields, _), left = self.purged_over_both(
            self.store_variants, "/purge/v", method="GET")
        self.assertEqual((status, fields["Cache-Purge-Result"], left),
                         (200, "exact; count=2", []))

    def test_a_purge_of_nothing_cached_is_412(self):
        (status, _, _), _ = self.purged_over_both(lambda http3: None,
                                                  "/never")
        self.assertEqual(status, 412)

    test_a_purge_of_nothing_cached_is_404 = None
    test_a_tag_purge_removes_every_object_with_the_tag = None
