"""Gzip stitching (esi_stitch): the delivery that records a plan has esid
deflate each verbatim run once; later gzip deliveries send those segments
as they are and deflate only what is not one (fragments, literals), with
the trailer's CRC folded.  Every gzip response here is read back through
zlib, which checks the CRC-32 and the length."""

import hashlib
import http.client
import json
import os
import socket
import struct
import zlib

from harness import (REQUEST_TIMEOUT, EsiTestCase, add_http2_variants,
                     held_socket, http1_only, poll)
from test_plan import PlanTestCase

GZIP = {"Accept-Encoding": "gzip"}
LEVEL = 6                   # esi_stitch_level's default
HEAD = 32                   # bytes of a run checked before its segment
MIN_RUN = 128               # shorter runs have no segment
STORED = 128                # live runs up to this go as stored blocks
LONG_RUNS = (50000, 300, 80000, 150, 40000)  # past a plain range's 32 KB mean


def text(seed, size):
    """Text that deflates to about half its size: hex of a hash chain."""
    out, h = [], seed.encode()
    for _ in range(size // 65 + 1):     # 65 characters a link
        h = hashlib.sha256(h).digest()
        out.append(h.hex() + " ")
    return "".join(out)[:size]


CONSTRUCTS = ['<esi:include src="/esi/a"/>', '<esi:remove>gone</esi:remove>',
              '<esi:include src="/esi/b"/>', '<!--esi <b>kept</b> -->']


def runs_of(seed, sizes=(700, 300, 2000, 150, 500)):
    return [text("%s%d" % (seed, i), n) for i, n in enumerate(sizes)]


def page(runs, constructs=CONSTRUCTS):
    out = runs[0]
    for construct, run in zip(constructs, runs[1:]):
        out += construct + run
    return out


def assembled(body):
    return (body.replace(CONSTRUCTS[0], "A").replace(CONSTRUCTS[1], "")
            .replace(CONSTRUCTS[2], "B").replace(CONSTRUCTS[3], " <b>kept</b> "))


def gunzip(data):
    """The plaintext of one whole gzip member; fails on a bad CRC or
    length, or on bytes after the member."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data) + d.flush()
    assert d.eof, "the gzip stream is cut short"
    assert not d.unused_data, "bytes after the gzip member"
    return out


def segment(run, level=LEVEL):
    """What esid stores for a run: raw deflate ended by a full flush."""
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, 8)
    return c.compress(run.encode()) + c.flush(zlib.Z_FULL_FLUSH)


def stored(data, final=False):
    """A stored deflate block holding `data`: BFINAL and BTYPE 00 in a
    byte, then LEN and NLEN."""
    return (bytes([1 if final else 0])
            + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data)


def live(data, level=LEVEL):
    """`data` deflated by itself, as the stitch filter's live stream
    does (memLevel 5) before a segment: then a full flush."""
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, 5)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


class StitchTestCase(PlanTestCase):
    HTTP = "esi_plan_zone plans:4m;"
    LOCATION = "esi_plan plans; esi_stitch on; gzip_vary on;"

    def gz(self, path, status="HIT", headers=None):
        code, hdrs, body = self.get(path, dict(GZIP, **(headers or {})))
        self.assertEqual(code, 200)
        self.assertEqual(hdrs.get("X-Cache-Status"), status)
        self.assertEqual(hdrs.get("Content-Encoding"), "gzip")
        self.assertIsNone(hdrs.get("Content-Length"))
        return body

    def warm(self, path, body):
        """The miss, then the hit that records the plan and its segments."""
        self.origin.route(path, body)
        for status in ("MISS", "HIT"):
            self.assertEqual(gunzip(self.gz(path, status)),
                             assembled(body).encode())

    def zone_json(self, name):
        r = self.esictl("plans", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return json.loads(r.stdout)[name]

    def assertStitched(self, raw, runs):
        for run in runs:
            if len(run) >= MIN_RUN:
                self.assertIn(segment(run), raw,
                              "run %r... was not sent as its segment" %
                              run[:16])

    def keep_copy(self, stem):
        """/stem's page warmed and hit once: esid's plan, which the
        worker keeps a copy of where esi_plan_reuse allows.  Returns the
        path, the body and its runs."""
        runs = runs_of(stem)
        body = page(runs)
        path = "/" + stem
        self.warm(path, body)
        self.gz(path)
        return path, body, runs

    def assertStitchedHit(self, path, body, runs, stitched, replayed):
        """A gzip hit of `path`: the assembled `body`, each run's segment
        in it; then esid's counts of stitched and replayed hits."""
        raw = self.gz(path)
        self.assertEqual(gunzip(raw), assembled(body).encode())
        self.assertStitched(raw, runs)
        stats = self.stats_json()
        self.assertEqual((stats["stitched"], stats["replayed"]),
                         (stitched, replayed))


class StitchTest(StitchTestCase):

    def test_a_planned_hit_sends_each_runs_segment_in_valid_gzip(self):
        runs = runs_of("p")
        body = page(runs)
        self.origin.route("/p", body)
        first = self.gz("/p", "MISS")
        self.assertEqual(gunzip(first), assembled(body).encode())
        for run in runs:
            self.assertNotIn(segment(run), first)
        self.assertEqual(gunzip(self.gz("/p")), assembled(body).encode())
        for _ in range(3):
            raw = self.gz("/p")
            self.assertEqual(gunzip(raw), assembled(body).encode())
            self.assertStitched(raw, runs)
        self.assertEqual(self.stats_json()["planned"], 3)

    def test_vary_follows_gzip_vary_for_every_client(self):
        body = page(runs_of("v"))
        self.warm("/v", body)
        _, hdrs, got = self.get("/v")
        self.assertEqual(got, assembled(body).encode())
        self.assertIsNone(hdrs.get("Content-Encoding"))
        self.assertEqual(hdrs.get("Vary"), "Accept-Encoding")
        _, hdrs, _ = self.get("/v", GZIP)
        self.assertEqual(hdrs.get("Vary"), "Accept-Encoding")

    def test_a_client_without_gzip_gets_the_plain_page_from_the_plan(self):
        body = page(runs_of("n"))
        self.warm("/n", body)
        for _ in range(2):
            self.hit("/n", assembled(body))
        self.assertEqual(self.stats_json()["planned"], 2)

    def test_nested_esi_in_a_fragment(self):
        self.origin.route("/esi/nest",
                          'n1<esi:include src="/esi/a"/>n2',
                          content_type="text/html")
        runs = runs_of("nest")
        body = page(runs, ['<esi:include src="/esi/nest"/>'] +
                    CONSTRUCTS[1:])
        expected = assembled(body.replace('<esi:include src="/esi/nest"/>',
                                          "n1An2")).encode()
        self.origin.route("/nest", body)
        for status in ("MISS", "HIT", "HIT", "HIT"):
            raw = self.gz("/nest", status)
            self.assertEqual(gunzip(raw), expected)
        self.assertStitched(raw, runs)

    def test_alt_failover(self):
        alt = '<esi:include src="/esi/missing" alt="/esi/c"/>'
        runs = runs_of("alt")
        body = page(runs, [alt] + CONSTRUCTS[1:])
        expected = assembled(body.replace(alt, "C")).encode()
        self.origin.route("/alt", body)
        for status in ("MISS", "HIT", "HIT"):
            raw = self.gz("/alt", status)
            self.assertEqual(gunzip(raw), expected)
        self.assertStitched(raw, runs)

    def test_a_page_made_of_one_run(self):
        body = text("one", 5000)
        self.origin.route("/one", body)
        for status in ("MISS", "HIT", "HIT"):
            raw = self.gz("/one", status)
            self.assertEqual(gunzip(raw), body.encode())
        self.assertIn(segment(body), raw)

    def test_a_short_run_between_segments_goes_as_a_stored_block(self):
        runs = runs_of("s")
        body = page(runs)
        self.warm("/s", body)
        raw = self.gz("/s")
        self.assertEqual(gunzip(raw), assembled(body).encode())
        self.assertStitched(raw, runs)
        for short in (b"A", b"B", b" <b>kept</b> "):
            self.assertIn(stored(short), raw)

    def test_a_short_end_of_the_page_is_the_streams_last_block(self):
        runs = runs_of("e", (700,))
        body = runs[0] + CONSTRUCTS[0] + "end"
        self.warm("/e", body)
        raw = self.gz("/e")
        self.assertEqual(gunzip(raw), (runs[0] + "Aend").encode())
        self.assertEqual(raw[-8 - 9:-8], stored(b"Aend", final=True))

    def test_a_run_that_outgrows_a_stored_block_is_deflated_whole(self):
        long = text("long", STORED)
        self.origin.route("/esi/long", long, content_type="text/plain")
        runs = runs_of("o", (700, 300))
        body = (runs[0] + CONSTRUCTS[0] + '<esi:include src="/esi/long"/>'
                + runs[1])
        expected = (runs[0] + "A" + long + runs[1]).encode()
        self.origin.route("/o", body)
        for status in ("MISS", "HIT", "HIT"):
            raw = self.gz("/o", status)
            self.assertEqual(gunzip(raw), expected)
        self.assertIn(live(("A" + long).encode()), raw)
        self.assertNotIn(stored(b"A"), raw)

    def test_short_runs_and_literals_are_deflated_live(self):
        self.LOCATION += " esi_cookies id;"
        short = ["x" * 10, "<p>", "y" * 127, "</p>"]
        body = page(short, ['<esi:vars>$(HTTP_COOKIE{id})</esi:vars>',
                            CONSTRUCTS[0], CONSTRUCTS[2]])
        self.origin.route("/short", body)
        for status, cookie in (("MISS", "1"), ("HIT", "2"), ("HIT", "3"),
                               ("HIT", "<4>")):
            raw = self.gz("/short", status, {"Cookie": "id=" + cookie})
            value = cookie.replace("<", "&lt;").replace(">", "&gt;")
            self.assertEqual(gunzip(raw).decode(), "x" * 10 + value + "<p>" +
                             "A" + "y" * 127 + "B" + "</p>")


class StitchMismatchTest(StitchTestCase):
    """The same object on disk with other bytes (key, Date, size and
    header size unchanged): the plan checks what it can see."""

    def test_a_run_whose_head_differs_drops_the_plan(self):
        runs = runs_of("h")
        body = page(runs)
        self.warm("/h", body)
        for i, run in enumerate(runs):
            changed = "Z" + run[1:]
            restore = self.rewrite_cached_body(run, changed)
            raw = self.gz("/h")
            expected = assembled(body.replace(run, changed)).encode()
            self.assertEqual(gunzip(raw), expected, "run %d" % i)
            restore()
            # the plan was forgotten: this hit records it again
            self.assertEqual(gunzip(self.gz("/h")), assembled(body).encode())
        self.assertEqual(self.error_log().count("a run differs"),
                         sum(len(r) >= MIN_RUN for r in runs))

    def test_a_construct_that_differs_after_a_segment(self):
        runs = runs_of("c")
        body = page(runs)
        self.warm("/c", body)
        restore = self.rewrite_cached_body(CONSTRUCTS[2],
                                           CONSTRUCTS[2].replace("/b", "/c"))
        raw = self.gz("/c")
        expected = assembled(body.replace(CONSTRUCTS[2], "C")).encode()
        self.assertEqual(gunzip(raw), expected)
        self.assertIn(segment(runs[0]), raw)   # before the construct
        self.assertIn("a construct differs", self.error_log())
        restore()

    def test_a_construct_that_differs_inside_a_try(self):
        # the try is checked whole before any of it runs: the plan is
        # dropped before it, its runs are deflated live, and what came
        # before went out as its segment
        runs = runs_of("t")
        body = (runs[0] + "<esi:try><esi:attempt>" + runs[1] + CONSTRUCTS[0]
                + runs[2] + "</esi:attempt><esi:except>" + runs[3]
                + "</esi:except></esi:try>" + runs[4])
        expected = runs[0] + runs[1] + "A" + runs[2] + runs[4]
        self.origin.route("/t", body)
        for status in ("MISS", "HIT", "HIT"):
            self.assertEqual(gunzip(self.gz("/t", status)), expected.encode())
        restore = self.rewrite_cached_body(CONSTRUCTS[0],
                                           CONSTRUCTS[0].replace("/a", "/c"))
        raw = self.gz("/t")
        self.assertEqual(gunzip(raw), expected.replace("A", "C").encode())
        self.assertIn(segment(runs[0]), raw)
        self.assertNotIn(segment(runs[2]), raw)
        self.assertIn("plan dropped at byte %d: a construct differs"
                      % len(runs[0]), self.error_log())
        restore()

    def test_a_run_is_trusted_past_its_head(self):
        """What the documentation promises, and no more: past its first
        bytes a run is the recorded one as long as the object's identity
        is the same (the seed's "never read at all on a hit")."""
        runs = runs_of("t")
        body = page(runs)
        self.warm("/t", body)
        run = runs[2]
        changed = run[:HEAD] + "Z" + run[HEAD + 1:]
        self.rewrite_cached_body(run, changed)
        raw = self.gz("/t")
        self.assertEqual(gunzip(raw), assembled(body).encode())


class UnreadTestCase(StitchTestCase):
    """The debug log of the location says which hits did not read the
    body (see StitchUnreadBodyTest)."""
    LOCATION = (StitchTestCase.LOCATION + " esi_plan_reuse 1h; sendfile on;"
                " error_log @@TMP@@/debug.log debug;")
    UNREAD = "the plan needs no byte of the body"
    SENDFILE = "sendfile: @"

    def logged(self, line):
        with open(os.path.join(self.tmp, "debug.log")) as f:
            return f.read().count(line)

    def unread_hits(self):
        return self.logged(self.UNREAD)

    def plain_hits(self, path, expected, n=3):
        """n plain hits after the one whose plan, esid's, the worker keeps
        (a plain client's plan is not a stitched one's); returns the hits
        that were not read and the sendfile calls they made.  An HTTP/2
        connection's sendfile goes to the server's log, not this one."""
        self.hit(path, expected)
        unread, sent = self.unread_hits(), self.logged(self.SENDFILE)
        for _ in range(n):
            self.hit(path, expected)
        return self.unread_hits() - unread, self.logged(self.SENDFILE) - sent


class StitchUnreadBodyTest(UnreadTestCase):
    """A hit replayed from the worker's copy of a plan that needs no byte
    of the body (every run a segment) does not read the body: the cache
    file's buffer reaches ESI as it is, with sendfile, and is only
    counted."""

    def test_a_replayed_stitched_hit_does_not_read_the_body(self):
        runs = runs_of("u")
        body = page(runs)
        self.warm("/u", body)
        self.gz("/u")                            # esid's plan, kept
        self.assertEqual(self.unread_hits(), 0)
        for _ in range(3):
            raw = self.gz("/u")
            self.assertEqual(gunzip(raw), assembled(body).encode())
            self.assertStitched(raw, runs)
        self.assertEqual(self.unread_hits(), 3)

    def test_a_run_without_a_segment_is_read(self):
        runs = runs_of("s", (700, 40, 2000, 150, 500))   # 40 < MIN_RUN
        body = page(runs)
        self.warm("/s", body)
        for _ in range(3):
            self.assertEqual(gunzip(self.gz("/s")), assembled(body).encode())
        self.assertEqual(self.unread_hits(), 0)

    def test_a_try_is_read(self):
        runs = runs_of("t")
        body = (runs[0] + "<esi:try><esi:attempt>" + CONSTRUCTS[0]
                + "</esi:attempt><esi:except>x</esi:except></esi:try>"
                + runs[1])
        self.origin.route("/t", body)
        for status in ("MISS", "HIT", "HIT", "HIT", "HIT"):
            self.assertEqual(gunzip(self.gz("/t", status)),
                             (runs[0] + "A" + runs[1]).encode())
        self.assertEqual(self.unread_hits(), 0)

    def test_a_client_without_gzip_gets_the_runs_from_the_cache_file(self):
        """Its runs go as ranges of the cache file, with sendfile, between
        the constructs' output: the body is not read either."""
        body = page(runs_of("p", LONG_RUNS))
        self.warm("/p", body)
        unread, sent = self.plain_hits("/p", assembled(body))
        self.assertEqual(unread, 3)
        if not self.HTTP2:
            self.assertGreaterEqual(sent, 3)

    def test_a_page_that_begins_and_ends_with_a_construct(self):
        runs = runs_of("c", LONG_RUNS)
        body = CONSTRUCTS[0] + page(runs) + CONSTRUCTS[2]
        self.warm("/c", body)
        self.assertEqual(self.plain_hits("/c", assembled(body))[0], 3)

    def test_a_client_without_gzip_gets_short_runs_copied(self):
        """Runs shorter than 32 KB on average are read and copied: a
        sendfile call a run would cost more."""
        body = page(runs_of("q", (20000, 300, 20000, 150, 20000)))
        self.warm("/q", body)
        self.assertEqual(self.plain_hits("/q", assembled(body)), (0, 0))


class StitchUnreadBelowSubFilterTest(UnreadTestCase):
    """sub_filter, above ESI, needs the body in memory: it is read."""
    LOCATION = (UnreadTestCase.LOCATION +
                " sub_filter_types text/html; sub_filter 'kept' 'KEPT';")

    def test_a_filter_above_that_needs_the_body_has_it(self):
        runs = runs_of("f", LONG_RUNS)
        body = page(runs)
        expected = assembled(body).replace("kept", "KEPT").encode()
        self.origin.route("/f", body)
        for status in ("MISS", "HIT", "HIT", "HIT", "HIT"):
            self.assertEqual(gunzip(self.gz("/f", status)), expected)
        self.assertEqual(self.plain_hits("/f", expected.decode()), (0, 0))
        self.assertEqual(self.unread_hits(), 0)


class StitchUnreadWithoutSendfileTest(UnreadTestCase):
    """Without sendfile the copy filter reads the cache file into memory
    for every client: a plain client's body is then held as any other."""
    LOCATION = UnreadTestCase.LOCATION.replace("sendfile on;",
                                               "sendfile off;")

    def test_a_body_read_into_memory_below_is_held(self):
        runs = runs_of("m", LONG_RUNS)
        body = CONSTRUCTS[0] + page(runs)
        self.warm("/m", body)
        self.assertEqual(self.plain_hits("/m", assembled(body))[1], 0)
        for _ in range(3):
            self.assertEqual(gunzip(self.gz("/m")), assembled(body).encode())


class StitchUnreadAioThreadsTest(UnreadTestCase):
    """With aio threads NGINX's sendfile runs in its thread pool: the
    ranges of a plain client's hit go there one after another."""
    LOCATION = UnreadTestCase.LOCATION + " aio threads;"

    def test_a_plain_clients_ranges_go_through_the_thread_pool(self):
        runs = runs_of("a", (300000, 200000, 400000, 150, 500))
        body = page(runs)
        self.warm("/a", body)
        self.assertEqual(self.plain_hits("/a", assembled(body))[0], 3)


class StitchUnreadKeepaliveTest(UnreadTestCase):
    """A plain client's hit mixes ranges of the cache file with memory, so
    NGINX corks it (tcp_nopush).  Uncorking a keepalive connection NGINX
    leaves Nagle's algorithm on, and the response's last short segment
    would wait for the client's delayed ACK; an include in a location
    without tcp_nopush (here, all of them) marks the connection so that
    NGINX never uncorks it.  Either way the worker's end of the connection
    is uncorked, with TCP_NODELAY, once the response is out."""
    LOCATION = UnreadTestCase.LOCATION + " tcp_nopush on;"

    def worker_end(self, client):
        """The worker's end of `client`'s connection (a copy of its
        descriptor)."""
        try:
            worker = held_socket(self.worker_pids(), self.port,
                                 client.getsockname()[1])
        except OSError as e:
            self.skipTest(str(e))
        self.assertIsNotNone(worker, "no worker holds the connection")
        return worker

    def options(self, sock):
        return tuple(sock.getsockopt(socket.IPPROTO_TCP, option)
                     for option in (socket.TCP_CORK, socket.TCP_NODELAY))

    @http1_only
    def test_a_keepalive_connection_is_left_without_nagle(self):
        body = page(runs_of("k", LONG_RUNS))
        self.warm("/k", body)
        self.hit("/k", assembled(body))         # the plan the worker keeps
        conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=REQUEST_TIMEOUT)
        unread = self.unread_hits()
        try:
            for _ in range(3):
                conn.request("GET", "/k")
                resp = conn.getresponse()
                self.assertEqual(resp.read(), assembled(body).encode())
                worker = self.worker_end(conn.sock)
                try:
                    # NGINX's keepalive handler, after the log phase
                    self.assertTrue(poll(lambda: self.options(worker)
                                         == (0, 1)), self.options(worker))
                finally:
                    worker.close()
        finally:
            conn.close()
        self.assertEqual(self.unread_hits() - unread, 3)


class StitchUnreadKeepaliveNopushTest(StitchUnreadKeepaliveTest):
    """The same with tcp_nopush on everywhere, as Debian's nginx.conf has
    it."""
    HTTP = StitchUnreadKeepaliveTest.HTTP + " tcp_nopush on;"
    LOCATION = UnreadTestCase.LOCATION


class UnreadGzipFilterTest(UnreadTestCase):
    """Without esi_stitch NGINX's gzip filter, below ESI, compresses the
    page and asks for the body in memory after ESI's header filter ran."""
    LOCATION = ("esi_plan plans; esi_stitch off; esi_plan_reuse 1h;"
                " sendfile on; gzip on; error_log @@TMP@@/debug.log debug;")

    def test_a_gzip_client_gets_the_page_gzipped_by_nginx(self):
        runs = runs_of("g", LONG_RUNS)
        body = page(runs)
        self.origin.route("/g", body)
        for status in ("MISS", "HIT", "HIT", "HIT", "HIT"):
            code, hdrs, raw = self.get("/g", GZIP)
            self.assertEqual(hdrs.get("X-Cache-Status"), status)
            self.assertEqual(hdrs.get("Content-Encoding"), "gzip")
            self.assertEqual(gunzip(raw), assembled(body).encode())
        self.assertEqual(self.stats_json()["stitched"], 0)


class StitchEvictionTest(StitchTestCase):
    HTTP = "esi_plan_zone plans:64k;"

    def test_segments_count_against_the_zone_and_go_with_their_plan(self):
        pages = {}
        for name in ("e1", "e2", "e3"):
            pages["/" + name] = page(runs_of(name, (20000, 20000, 8000,
                                                    100, 100)))
            self.warm("/" + name, pages["/" + name])
        for _ in range(2):
            for path, body in pages.items():
                raw = self.gz(path)
                self.assertEqual(gunzip(raw), assembled(body).encode())
        zone = self.zone_json("plans")
        self.assertLessEqual(zone["bytes"], 64 * 1024)
        self.assertGreater(zone["evictions"], 0)


class SlowClient:
    """A gzip request whose reader stops after the headers: the worker
    is left sending the response."""

    def __init__(self, port, path):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(b"GET %s HTTP/1.1\r\nHost: localhost\r\n"
                          b"Accept-Encoding: gzip\r\nConnection: close"
                          b"\r\n\r\n" % path.encode())
        self.data = self.sock.recv(1024)

    def read_chunks(self, size=1 << 20):
        """The body's chunks, read `size` bytes at a time; self.head
        has the response's head."""
        while True:
            chunk = self.sock.recv(size)
            if not chunk:
                break
            self.data += chunk
        self.sock.close()
        self.head, _, body = self.data.partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in self.head, self.head
        return chunks(body)

    def read_all(self, size=1 << 20):
        """The dechunked body (see read_chunks)."""
        return b"".join(self.read_chunks(size))


def chunks(data):
    """The payloads of a chunked body, the last (empty) chunk left out."""
    out = []
    while True:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out.append(rest[:n])
        data = rest[n + 2:]


class StitchSlowClientTest(StitchTestCase):
    """Deflating live for a client slower than the page, the filter is out
    of output buffers with input taken: it must not look at a buffer again
    once zlib has read it, since its maker may have reused it by then (one
    that did sent a later run early, in about a third of such responses)."""

    LISTEN = " sndbuf=16k"

    @http1_only
    def test_a_slow_client_gets_every_byte_in_order(self):
        self.start()
        for i in range(8):
            path = "/slow%d" % i
            body = page(runs_of(path, (200000, 300000, 250000, 200000,
                                       100000)))
            self.origin.route(path, body)
            for status in (b"MISS", b"HIT"):
                client = SlowClient(self.port, path)
                raw = client.read_all(512)
                self.assertIn(b"X-Cache-Status: " + status, client.head)
                self.assertEqual(gunzip(raw), assembled(body).encode(),
                                 "%s, %s" % (path, status.decode()))


class StitchOneWriteTest(StitchTestCase):
    """A stitched response's output waits for the next turn of the
    worker's event loop, so that what the page and its fragments send in
    one turn goes in one write: here the fragments are answered by this
    server, within the turn, and a hit's page must come in one chunk (the
    chunked filter frames each write), not one before each fragment and
    one after."""

    LOCATIONS = 'location /here/ { return 200 "HERE"; }'
    CONSTRUCTS = ['<esi:include src="/here/a"/>',
                  '<esi:include src="/here/b"/>']

    @http1_only
    def test_a_page_and_fragments_answered_in_its_turn_go_in_one_write(self):
        self.start()
        runs = runs_of("w", (3000, 3000, 3000))
        body = page(runs, self.CONSTRUCTS)
        self.origin.route("/w", body)
        # the miss, then the hit that records the plan: both wait on esid,
        # whose answers come in turns of their own
        for status in (b"MISS", b"HIT", b"HIT", b"HIT", b"HIT"):
            client = SlowClient(self.port, "/w")
            got = client.read_chunks()
            self.assertIn(b"X-Cache-Status: " + status, client.head)
            self.assertEqual(gunzip(b"".join(got)),
                             "HERE".join(runs).encode())
            if self.stats_json()["stitched"] > 0:
                self.assertEqual(len(got), 1, [len(c) for c in got])
        self.assertEqual(self.stats_json()["stitched"], 3)


class StitchStreamReuseTest(StitchTestCase):
    """A worker keeps the deflate streams of responses that ended, reset,
    for the next ones (setting one up cost a stitched hit more than
    deflating its fragments): a kept stream deflates at the level of the
    response it serves, and carries nothing of the one it served before,
    even one cut off in the middle of its deflate."""

    LISTEN = " sndbuf=16k"
    LOCATIONS = """
        location /l1/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            proxy_cache pages;
            proxy_cache_valid 200 10m;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
            esi_plan plans;
            esi_stitch on;
            esi_stitch_level 1;
        }"""
    FRAGMENT = "".join("<li>item %d, shelf %d</li>\n" % (i, i % 7)
                       for i in range(300))

    def test_a_kept_stream_deflates_at_the_level_of_its_response(self):
        fragment = self.FRAGMENT.encode()
        self.assertNotEqual(live(fragment, 1), live(fragment))
        self.origin.route("/esi/frag", self.FRAGMENT,
                          content_type="text/plain")
        runs = runs_of("lv", (700, 300))
        body = runs[0] + '<esi:include src="/esi/frag"/>' + runs[1]
        expected = (runs[0] + self.FRAGMENT + runs[1]).encode()
        for path in ("/lv", "/l1/lv"):
            self.origin.route(path, body)
            for status in ("MISS", "HIT"):
                self.assertEqual(gunzip(self.gz(path, status)), expected)
        for _ in range(3):
            for path, level in (("/lv", LEVEL), ("/l1/lv", 1)):
                raw = self.gz(path)
                self.assertEqual(gunzip(raw), expected, path)
                self.assertTrue(live(fragment, level) in raw,
                                "%s not deflated at level %d" % (path, level))

    @http1_only
    def test_a_stream_cut_off_while_deflating_comes_back_clean(self):
        self.start()
        big = text("big", 2000000)          # ~1 MB deflated: past the
        self.origin.route("/esi/big", big,  # filter's buffers and sndbuf
                          content_type="text/plain")
        runs = runs_of("cut", (700, 300))
        body = runs[0] + '<esi:include src="/esi/big"/>' + runs[1]
        expected = (runs[0] + big + runs[1]).encode()
        self.origin.route("/cut", body)
        for status in ("MISS", "HIT", "HIT"):
            self.assertEqual(gunzip(self.gz("/cut", status)), expected)
        client = SlowClient(self.port, "/cut")
        while len(client.data) < 65536:      # into the fragment's deflate
            client.data += client.sock.recv(4096)
        client.sock.close()
        # its log line, then its pool's cleanup, which gives the stream back
        self.access_log(4)
        for _ in range(3):
            self.assertEqual(gunzip(self.gz("/cut")), expected)


class StitchPinTest(StitchTestCase):
    """A segment a worker is sending is never reused, also after its plan
    is evicted and the arena is short of room; a worker killed mid-send
    lets go of it."""

    HTTP = "esi_plan_zone plans:2m;"
    ESID_ARGS = ("--log-level", "debug", "--segment-arena", "4M")
    LISTEN = " sndbuf=16k"      # a send buffer that cannot take it all
    BIG = (400000, 500000, 1000000, 200, 200)     # ~1 MB of gzip

    def pins(self):
        return self.stats_json()["segment_pins"]

    def hold(self, path):
        client = SlowClient(self.port, path)
        self.assertTrue(poll(lambda: self.pins() == 1, bound=10.0),
                        "the held request pins nothing")
        return client

    @http1_only
    def test_a_segment_being_sent_is_never_reused(self):
        first = page(runs_of("big0", self.BIG))
        self.warm("/big0", first)
        held = self.hold("/big0")
        # each plan evicts the one before it (the zone holds one), and
        # the arena, first fit, would give the next one the first's room
        for i in range(1, 5):
            body = page(runs_of("big%d" % i, self.BIG))
            self.warm("/big%d" % i, body)
        stats = self.stats_json()
        self.assertEqual(stats["segment_pins"], 1)
        self.assertGreaterEqual(stats["segment_quarantined_extents"], 1)
        self.assertEqual(gunzip(held.read_all()), assembled(first).encode())
        self.assertTrue(poll(lambda: self.pins() == 0, bound=10.0))

    def test_pins_go_when_the_requests_end(self):
        body = page(runs_of("p", self.BIG))
        self.warm("/p", body)
        for _ in range(3):
            self.assertEqual(gunzip(self.gz("/p")), assembled(body).encode())
        self.assertTrue(poll(lambda: self.pins() == 0, bound=10.0))
        self.assertEqual(self.stats_json()["stitched"], 3)

    @http1_only
    def test_a_worker_killed_mid_send_lets_go_of_its_pins(self):
        body = page(runs_of("k", self.BIG))
        self.warm("/k", body)
        held = self.hold("/k")
        [worker] = self.worker_pids()
        self.kill_worker(worker)
        self.assertTrue(poll(lambda: self.pins() == 0, bound=10.0),
                        "a dead worker still pins its segments")
        held.sock.close()
        self.assertEqual(self.stats_json()["segment_retired_pin_tables"], 0)
        # its replacement is served from the same segments
        raw = self.gz("/k")
        self.assertEqual(gunzip(raw), assembled(body).encode())
        self.assertStitched(raw, runs_of("k", self.BIG))


class StitchReuseTest(StitchTestCase):
    """The worker's copy of a reusable plan holds a pin on its segments
    while it is kept, lets go when it expires, and goes with the
    connection to esid (whose arena and pin table go with it).  An hour:
    every hit of the test falls within it, however slow the machine."""
    LOCATION = StitchTestCase.LOCATION + " esi_plan_reuse 1h;"

    def test_replayed_hits_stitch(self):
        runs = runs_of("r")
        body = page(runs)
        self.warm("/r", body)
        for replayed in (0, 1, 2):               # esid's plan, the copy
            self.assertStitchedHit("/r", body, runs, 1 + replayed, replayed)


class StitchReuseExpiryTest(StitchTestCase):
    """A copy kept for 200 ms: whenever the hits come, once its pin is gone
    (the worker's sweep, each second) the copy is gone too, and the next
    hit asks esid again."""
    LOCATION = StitchTestCase.LOCATION + " esi_plan_reuse 200ms;"

    def test_the_expired_copy_lets_go(self):
        path, body, runs = self.keep_copy("e")
        self.assertTrue(poll(lambda: self.stats_json()["segment_pins"] == 0,
                             bound=10.0), "the expired copy pins segments")
        # esid's plan again, not the copy
        self.assertStitchedHit(path, body, runs, 2, 0)


class StitchReuseReconnectTest(StitchTestCase):
    LOCATION = StitchTestCase.LOCATION + " esi_plan_reuse 1h;"

    def test_a_copy_is_not_replayed_once_esid_is_replaced(self):
        _, body, runs = self.keep_copy("c")
        # the copy's count; the request's goes once the worker has ended it,
        # which may be after the client has read the whole answer
        self.assertTrue(poll(lambda: self.stats_json()["segment_pins"] == 1,
                             bound=10.0), "the copy holds no pin")
        self.esid.kill()
        self.start_esid()
        # the new esid knows no plan: the hit is parsed, never replayed
        # from the old arena
        raw = self.gz("/c")
        self.assertEqual(gunzip(raw), assembled(body).encode())
        stats = self.stats_json()
        self.assertEqual((stats["streams"], stats["replayed"]), (1, 0))
        for replayed in (0, 1):                  # esid's plan, the copy
            raw = self.gz("/c")
            self.assertEqual(gunzip(raw), assembled(body).encode())
            self.assertStitched(raw, runs)
            self.assertEqual(self.stats_json()["replayed"], replayed)


class StitchClientTest(StitchTestCase):
    LOCATION = StitchTestCase.LOCATION + \
        ' gzip_disable "NoGzip"; gzip_http_version 1.1;'

    def test_gzip_disable_is_honoured(self):
        body = page(runs_of("d"))
        self.warm("/d", body)
        _, hdrs, got = self.get("/d", dict(GZIP, **{"User-Agent": "NoGzip"}))
        self.assertIsNone(hdrs.get("Content-Encoding"))
        self.assertEqual(got, assembled(body).encode())

    @http1_only
    def test_gzip_http_version_is_honoured(self):
        body = page(runs_of("hv"))
        self.warm("/hv", body)
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(b"GET /hv HTTP/1.0\r\nHost: localhost\r\n"
                      b"Accept-Encoding: gzip\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, got = data.partition(b"\r\n\r\n")
        self.assertNotIn(b"Content-Encoding", head)
        self.assertEqual(got, assembled(body).encode())


class StitchConfigurationTest(EsiTestCase):

    def nginx_t(self, http, location):
        from test_limits import ConfigurationErrorTest
        self.HTTP = http
        return ConfigurationErrorTest.nginx_t(self, location)

    def test_stitch_without_plan_is_refused(self):
        code, out = self.nginx_t("", "esi_plan off; esi_stitch on;")
        self.assertNotEqual(code, 0)
        self.assertIn('"esi_stitch" requires "esi_plan"', out)

    def test_stitch_in_the_default_plan_zone_is_accepted(self):
        code, out = self.nginx_t("", "esi_stitch on;")
        self.assertEqual(code, 0, out)

    def test_a_plan_zone_named_default_is_refused(self):
        code, out = self.nginx_t("esi_plan_zone default:1m;", "")
        self.assertNotEqual(code, 0)
        self.assertIn('plan zone "default" is esid\'s own', out)

    def test_stitch_level_outside_1_to_9_is_refused(self):
        for level in ("0", "10"):
            code, out = self.nginx_t("esi_plan_zone plans:1m;",
                                     "esi_plan plans; esi_stitch on; "
                                     "esi_stitch_level %s;" % level)
            self.assertNotEqual(code, 0)
            self.assertIn("must be between 1 and 9", out)

    def test_stitch_with_plan_is_accepted(self):
        code, out = self.nginx_t("esi_plan_zone plans:1m;",
                                 "esi_plan plans; esi_stitch on; "
                                 "esi_stitch_level 9;")
        self.assertEqual(code, 0, out)


add_http2_variants(globals())
