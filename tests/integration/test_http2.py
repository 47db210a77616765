"""HTTP/2 clients: h2c with prior knowledge (`listen PORT http2` on a plain
listener, what it is in NGINX 1.22), h2 over TLS by ALPN with a certificate
made for the test, and many streams of one connection at once.  Streams are
requests on one connection, so a module that took r->connection for one
request would mix them up here; every body is compared byte for byte.

The markup, gzip, stitch, language and purge tests also run over HTTP/2
(harness.add_http2_variants); this file is what only HTTP/2 has.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import unittest

from harness import EsiTestCase, free_port, h2, poll

H2LOAD = shutil.which("h2load") or "/usr/bin/h2load"
INCLUDES = 32
STREAMS = 100           # h2load -m: concurrent streams per connection
REQUESTS = 1000         # h2load -n
CONNECTIONS = 2         # h2load -c
SAMPLE = 100            # bodies fetched beside h2load, compared whole
HELD = 10               # streams whose connection closes mid-include

# Each request's connection serial number ($connection) and protocol.
CONN_LOG = """
    log_format conn '$connection $server_protocol $esi_status';
    access_log @@TMP@@/conn.log conn;
"""
# Fragments cached, so that the origin is not the load test's bottleneck.
CACHED_FRAGMENTS = """
        location /frag/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache pages;
            proxy_cache_valid 200 10m;
        }
"""


def many_includes_page(n):
    """A page of n includes of /frag/i and what it assembles to."""
    page = "".join('<p>%d</p><esi:include src="/frag/%d"/>' % (i, i)
                   for i in range(n)) + "<p>end</p>"
    body = "".join("<p>%d</p>[fragment %d]" % (i, i)
                   for i in range(n)) + "<p>end</p>"
    return page, body.encode()


# h2 by ALPN beside the h2c listener: curl multiplexes over it, not over
# h2c (h2.fetch_multiplexed says why).
TLS_SERVER = """
        listen 127.0.0.1:%d ssl http2;
        ssl_certificate @@TMP@@/cert.pem;
        ssl_certificate_key @@TMP@@/key.pem;
"""


class Http2TestCase(EsiTestCase):
    HTTP2 = True
    HTTP = CONN_LOG
    LOCATIONS = CACHED_FRAGMENTS

    def setUp(self):
        super().setUp()
        self.origin.prefix("/frag/", lambda target: "[fragment %s]" %
                           target.rsplit("/", 1)[1])
        self.make_certificate()
        self.tls_port = free_port()
        self.SERVER = TLS_SERVER % self.tls_port

    def tls_url(self, path):
        return "https://127.0.0.1:%d%s" % (self.tls_port, path)

    def conn_log(self, count):
        """The first `count` lines of conn.log as (connection, protocol,
        esi_status)."""
        return [tuple(line.split())
                for line in self.access_log(count, "conn.log")]

    def fetch_multiplexed(self, path, count):
        """`count` bodies of path fetched at once over one TLS connection;
        fails unless curl got them all."""
        code, err, bodies = h2.fetch_multiplexed(self.tls_url(path), count,
                                                 self.tmp)
        self.assertEqual(code, 0, err)
        return bodies


class H2cTest(Http2TestCase):

    def test_a_page_is_assembled_for_an_h2c_client(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.conn_log(1)[0][1:], ("HTTP/2.0", "processed"))


class H2cCookieTest(Http2TestCase):
    LOCATION = "esi_cookies user group;"

    def test_cookies_of_several_header_fields_are_read_together(self):
        # HTTP/2 clients may send each cookie in a field of its own (RFC
        # 9113, 8.2.3); NGINX joins them for the request
        self.origin.route("/page", "<esi:vars>[$(HTTP_COOKIE{user})/"
                          "$(HTTP_COOKIE{group})]</esi:vars>")
        self.start()
        reply = h2.request("http://127.0.0.1:%d/page" % self.port,
                           headers=[("Cookie", "user=ann"),
                                    ("Cookie", "group=gold")])
        self.assertTrue(reply.complete, reply.error)
        self.assertEqual(reply.body, b"[ann/gold]")


class ClientGoneTest(Http2TestCase):
    """A connection closed while its streams wait for includes: every
    stream ends, the worker serves on, esid has no stream left."""

    def test_streams_of_a_closed_connection_end_and_the_worker_serves(self):
        released = self.origin.hold("/esi/hold")
        self.origin.route("/esi/hold", "H")
        # the tail keeps each stream's buffers held behind its include
        self.origin.route("/held", 'a<esi:include src="/esi/hold"/>b'
                          + "<p>tail</p>" * 20000)
        self.origin.route("/other", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.start()
        curl, _ = h2.start_multiplexed(self.tls_url("/held"), HELD,
                                       self.tmp)
        try:
            self.assertTrue(self.origin.wait_for_hits("/esi/hold", HELD),
                            "the streams' includes never reached the "
                            "origin")
            curl.kill()
            curl.wait()
        finally:
            released.set()
        self.assertBody("/other", b"aXc")
        self.assertTrue(poll(lambda: self.stats_json()["active_streams"]
                             == 0, bound=10.0), "esid still has streams")


class TlsTest(Http2TestCase):
    """h2 over TLS: ALPN on an `ssl http2` listener."""

    def test_a_page_is_assembled_for_an_h2_client_over_tls(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.start()
        reply = h2.request(self.tls_url("/page"), tls=True)
        self.assertTrue(reply.complete, reply.error)
        self.assertEqual((reply.status, reply.body), (200, b"aXc"))
        self.assertEqual(self.conn_log(1)[0][1:], ("HTTP/2.0", "processed"))

    def test_many_streams_of_one_connection_are_each_assembled(self):
        page, body = many_includes_page(INCLUDES)
        self.origin.route("/page", page)
        self.assertBody("/page", body)       # page and fragments cached
        bodies = self.fetch_multiplexed("/page", SAMPLE)
        for i, got in enumerate(bodies):
            self.assertEqual(got, body, "stream %d" % i)
        log = self.conn_log(1 + SAMPLE)[1:]
        self.assertEqual({status for _, _, status in log}, {"processed"})
        self.assertEqual({proto for _, proto, _ in log}, {"HTTP/2.0"})
        # curl multiplexed them: far fewer connections than streams
        self.assertLess(len({conn for conn, _, _ in log}), SAMPLE // 10)


class H2loadTest(Http2TestCase):
    """h2load (h2c), 100 concurrent streams per connection, on a page of
    32 includes, run after run until curl, started once h2load's first
    requests are logged, has fetched a sample of bodies (multiplexed over
    TLS) and compared them whole."""

    def h2load(self):
        """An h2load run, started."""
        return subprocess.Popen(
            [H2LOAD, "-n", str(REQUESTS), "-c", str(CONNECTIONS),
             "-m", str(STREAMS), "http://127.0.0.1:%d/page" % self.port],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)

    def assertH2loadClean(self, load, body_bytes):
        """Waits for the run; every request succeeded with a 2xx and a
        body of the assembled page's length."""
        out = load.communicate(timeout=300)[0].decode(errors="replace")
        self.assertEqual(load.returncode, 0, out)
        done = re.search(r"requests: (\d+) total, (\d+) started, "
                         r"(\d+) done, (\d+) succeeded, (\d+) failed, "
                         r"(\d+) errored, (\d+) timeout", out)
        self.assertIsNotNone(done, out)
        self.assertEqual(tuple(int(x) for x in done.groups()),
                         (REQUESTS, REQUESTS, REQUESTS, REQUESTS, 0, 0, 0),
                         out)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, "
                          r"(\d+) 4xx, (\d+) 5xx", out)
        self.assertEqual(tuple(int(x) for x in codes.groups()),
                         (REQUESTS, 0, 0, 0), out)
        # DATA bytes: every body had the assembled page's length
        data = re.search(r"traffic: .* \((\d+)\) data", out)
        self.assertIsNotNone(data, out)
        self.assertEqual(int(data.group(1)), REQUESTS * body_bytes,
                         out)

    def test_100_streams_per_connection_complete_with_every_body_right(self):
        page, body = many_includes_page(INCLUDES)
        self.origin.route("/page", page)
        self.assertBody("/page", body)       # cached and planned
        sample = []
        sampler = threading.Thread(target=lambda: sample.append(
            h2.fetch_multiplexed(self.tls_url("/page"), SAMPLE, self.tmp)),
            daemon=True)
        load = self.h2load()
        self.access_log(2, "conn.log")           # h2load's first request
        sampler.start()
        self.assertH2loadClean(load, len(body))
        runs = 1
        while sampler.is_alive():
            self.assertH2loadClean(self.h2load(), len(body))
            runs += 1
        sampler.join()
        self.assertEqual(len(sample), 1, "the sampler did not finish")
        code, err, bodies = sample[0]
        self.assertEqual(code, 0, err)
        for i, got in enumerate(bodies):
            self.assertEqual(got, body, "sampled stream %d" % i)
        log = self.conn_log(1 + runs * REQUESTS + SAMPLE)
        self.assertEqual([s for _, _, s in log if s != "processed"], [])
        sys.stderr.write("\n  h2load: %d runs of %d requests beside %d "
                         "sampled\n" % (runs, REQUESTS, SAMPLE))


if __name__ == "__main__":
    unittest.main()
