"""Gzip in and out, cell by cell: upstream page and fragment encodings,
clients that do and do not accept gzip, gunzip on and off; encodings other
than gzip; broken gzip from upstream; small inflate buffers.

Every gzip response is read back through Python's gzip module.
"""

import gzip
import hashlib
import http.client
import socketserver
import threading
import unittest
import zlib

from harness import REQUEST_TIMEOUT, EsiTestCase, Response

FRAGMENT = "<b>fragment</b>"
PAGE = ("<html>" + "page text, repeated. " * 40
        + '<esi:include src="/esi/frag"/>'
        + " and after it " * 40 + "</html>")
ASSEMBLED = PAGE.replace('<esi:include src="/esi/frag"/>', FRAGMENT).encode()
# What a client may get of the page before a refused include.
BEFORE_INCLUDE = PAGE.split("<esi:include")[0].encode()

GZIP_OUT = "gzip on; gzip_min_length 1; gzip_vary on;"

REFUSAL_FIXES = ('"gunzip on"',
                 '"proxy_set_header Accept-Encoding """')


def big_page(size, every=500):
    """About `size` bytes of markup with an include every `every` lines (or
    only at the end), and what it assembles to."""
    parts, expected, n, length = [], [], 0, 0
    while length < size:
        text = "<p>line %06d of a large page, %08x</p>\n" % (
            n, n * 2654435761 % 2 ** 32)
        parts.append(text)
        expected.append(text)
        length += len(text)
        n += 1
        if every and n % every == 0:
            parts.append('<esi:include src="/esi/frag"/>')
            expected.append(FRAGMENT)
    parts.append('<esi:include src="/esi/frag"/>')
    expected.append(FRAGMENT)
    return "".join(parts), "".join(expected).encode()


class _RawHandler(socketserver.BaseRequestHandler):
    def handle(self):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        target = data.split(b" ", 2)[1].decode()
        head, pieces = self.server.routes.get(target, (None, None))
        if head is None:
            self.request.sendall(b"HTTP/1.1 404 Not Found\r\n"
                                 b"Content-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
            return
        try:
            self.request.sendall(head)
            for piece in pieces:
                if piece is None:
                    # Until the client has had the bytes sent so far (a
                    # hang guard, not a pace: the test sets it).
                    self.server.resume.wait(REQUEST_TIMEOUT)
                    continue
                self.request.sendall(piece)
        except OSError:
            pass


class _RawServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RawOrigin:
    """An origin that sends a body exactly as given: chunked, cut, bad."""

    def __init__(self):
        self.server = _RawServer(("127.0.0.1", 0), _RawHandler)
        self.server.routes = {}
        self.server.resume = threading.Event()
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def chunked(self, path, body, encoding="gzip", piece=4096,
                pause_at=None):
        """Serves `body` chunked; with `pause_at`, stops before the chunk
        holding that byte until `resume` is set, so that what came before
        it can reach the client first."""
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                "Content-Encoding: %s\r\nTransfer-Encoding: chunked\r\n"
                "Connection: close\r\n\r\n" % encoding).encode()
        pieces = [b"%x\r\n%s\r\n" % (len(body[i:i + piece]),
                                     body[i:i + piece])
                  for i in range(0, len(body), piece)]
        if pause_at is not None:
            pieces.insert(pause_at // piece, None)
        self.server.routes[path] = (head, pieces + [b"0\r\n\r\n"])

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class GzipMatrixTest(EsiTestCase):
    """{plain, gzip} page x {plain, gzip} fragment x {client accepts gzip,
    does not} x {gunzip on, off}; gzip and gzip_vary on throughout."""

    def run_cell(self, page_gzip, fragment_gzip, client_gzip, gunzip):
        self.LOCATION = GZIP_OUT + (" gunzip on;" if gunzip else "")
        self.FRAGMENT_LOCATION = "gunzip on;" if gunzip else ""
        self.origin.route("/page", PAGE, gzip=page_gzip)
        self.origin.route("/esi/frag", FRAGMENT, gzip=fragment_gzip)
        headers = {"Accept-Encoding": "gzip"} if client_gzip else {}

        r = self.fetch("/page", headers)

        if fragment_gzip and not gunzip:
            self.assertRefused(r, client_gzip)
            return

        self.assertTrue(r.complete, "incomplete response: %r" % (r,))
        self.assertEqual(r.status, 200)
        self.assertIsNone(r.header("Content-Length"))
        self.assertIn("Accept-Encoding", r.header("Vary") or "")
        if client_gzip:
            self.assertEqual(r.header("Content-Encoding"), "gzip")
            self.assertEqual(gzip.decompress(r.body), ASSEMBLED)
        else:
            self.assertIsNone(r.header("Content-Encoding"))
            self.assertEqual(r.body, ASSEMBLED)

    def assertRefused(self, r, client_gzip):
        self.assertFalse(r.complete, "a gzipped fragment was spliced: %r"
                         % (r,))
        # What went out, decoded (it is cut short: no end of stream), is
        # a prefix of the page before the include: not the fragment, not
        # its gzipped bytes.
        body = r.body
        if r.header("Content-Encoding") == "gzip":
            self.assertTrue(client_gzip, "gzip for a client without it")
            body = zlib.decompressobj(31).decompress(body)
        else:
            self.assertFalse(client_gzip and body,
                             "a gzip client got a body not gzipped: %r"
                             % body[:80])
        self.assertTrue(BEFORE_INCLUDE.startswith(body),
                        "not a prefix of the page before the include: %r"
                        % body[-80:])
        self.assertNotIn(b"fragment", body)
        log = self.error_log()
        self.assertIn('include "/esi/frag" answered with Content-Encoding '
                      '"gzip"', log)
        for fix in REFUSAL_FIXES:
            self.assertIn(fix, log)


def _cell(page_gzip, fragment_gzip, client_gzip, gunzip):
    def test(self):
        self.run_cell(page_gzip, fragment_gzip, client_gzip, gunzip)
    return test


for _page in (False, True):
    for _fragment in (False, True):
        for _client in (False, True):
            for _gunzip in (False, True):
                _name = "test_%s_page_%s_fragment_%s_gunzip_%s" % (
                    "gzipped" if _page else "plain",
                    "gzipped" if _fragment else "plain",
                    "gzip_client" if _client else "plain_client",
                    "on" if _gunzip else "off")
                setattr(GzipMatrixTest, _name,
                        _cell(_page, _fragment, _client, _gunzip))


class OtherEncodingTest(EsiTestCase):
    LOCATION = GZIP_OUT

    def test_brotli_page_goes_out_exactly_as_it_arrived(self):
        body = ('a<esi:include src="/esi/frag"/>c\x00\xff').encode("latin-1")
        self.origin.route("/page", body, headers=[("Content-Encoding", "br")])
        self.origin.route("/esi/frag", FRAGMENT)
        _, headers, got = self.get("/page", {"Accept-Encoding": "gzip, br"})
        self.assertEqual(got, body)
        self.assertEqual(headers.get("Content-Encoding"), "br")
        self.assertEqual(self.origin.hits("/esi/frag"), 0)
        self.assertIn('esi: "br" encoded response left unprocessed: only '
                      'gzip is decoded', self.error_log())


class BrokenGzipTest(EsiTestCase):
    """A cut or corrupt gzip body: a clear error, what went out is a prefix
    of the page, the connection is closed; no crash, no hang."""

    # The include comes after the break: what precedes it streams out.
    PAGE, EXPECTED = big_page(200 * 1024, every=None)

    def setUp(self):
        super().setUp()
        self.raw = RawOrigin()
        self.addCleanup(self.raw.close)
        self.LOCATIONS = ("location /raw/ {\n"
                          "    proxy_pass http://127.0.0.1:%d;\n"
                          "    proxy_http_version 1.1;\n"
                          "    esi on;\n"
                          "}\n" % self.raw.port)
        self.origin.route("/esi/frag", FRAGMENT)

    @classmethod
    def truncated(cls):
        data = gzip.compress(cls.PAGE.encode(), mtime=0)
        return data[:len(data) // 2]

    @classmethod
    def half(cls):
        """Compressed bytes well before the break in truncated() and
        corrupt()."""
        return len(cls.truncated()) // 2

    @classmethod
    def corrupt(cls):
        # Half the page, flushed to a byte boundary, then a block header
        # of the reserved type 3: "invalid block type" right there.
        page = cls.PAGE.encode()
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        data = c.compress(page[:len(page) // 2]) + c.flush(zlib.Z_FULL_FLUSH)
        return data + b"\xff" * 64 + c.compress(page[len(page) // 2:]) \
            + c.flush()

    def fetch_in_two(self, path):
        """GET `path` from the raw origin, which stops at its pause: the
        first body bytes are read, then the origin sends the rest.
        Returns the Response and the bytes read before the rest."""
        self.start()
        conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=REQUEST_TIMEOUT)
        self.addCleanup(conn.close)
        self.addCleanup(self.raw.server.resume.set)
        conn.request("GET", path)
        resp = conn.getresponse()
        first = resp.read1(65536)
        self.raw.server.resume.set()
        body, complete = first, True
        try:
            body += resp.read()
        except http.client.IncompleteRead as e:
            body, complete = body + e.partial, False
        except OSError:
            complete = False
        return Response(resp.status, resp.headers, body, complete), first

    def assertCutOff(self, path, what, sent_before=False):
        if sent_before:
            r, first = self.fetch_in_two(path)
            self.assertEqual(r.status, 200)
            self.assertGreater(len(first), 0)
        else:
            r = self.fetch(path)
        self.assertFalse(r.complete, "a broken body looked whole: %r" % (r,))
        self.assertTrue(self.EXPECTED.startswith(r.body),
                        "what went out is not a prefix of the page")
        self.assertIn("esi: %s gzip body from upstream" % what,
                      self.error_log())

    def test_truncated_gzip_with_content_length_is_cut_off(self):
        self.origin.route("/page", self.truncated(),
                          headers=[("Content-Encoding", "gzip")])
        self.assertCutOff("/page", "truncated")

    def test_corrupt_gzip_with_content_length_is_cut_off(self):
        self.origin.route("/page", self.corrupt(),
                          headers=[("Content-Encoding", "gzip")])
        self.assertCutOff("/page", "corrupt")

    def test_truncated_chunked_gzip_is_cut_off(self):
        self.raw.chunked("/raw/page", self.truncated())
        self.assertCutOff("/raw/page", "truncated")

    def test_corrupt_chunked_gzip_is_cut_off(self):
        self.raw.chunked("/raw/page", self.corrupt())
        self.assertCutOff("/raw/page", "corrupt")

    def test_truncated_gzip_keeps_what_was_sent_and_closes(self):
        self.raw.chunked("/raw/page", self.truncated(),
                         pause_at=self.half())
        self.assertCutOff("/raw/page", "truncated", sent_before=True)

    def test_corrupt_gzip_keeps_what_was_sent_and_closes(self):
        self.raw.chunked("/raw/page", self.corrupt(), pause_at=self.half())
        self.assertCutOff("/raw/page", "corrupt", sent_before=True)

    def test_chunked_gzip_is_assembled(self):
        self.raw.chunked("/raw/page", gzip.compress(self.PAGE.encode()))
        self.assertBody("/raw/page", self.EXPECTED)


class GzipFallbackTest(EsiTestCase):
    """A gzipped page that falls back goes on inflated and unprocessed, to
    its end: the end of the inflated body is a buffer the writer takes."""

    LOCATION = "esi_max_page_size 64k;"

    # The include is the last thing: what went out processed is raw too.
    PAGE, _ = big_page(200 * 1024, every=None)

    def test_gzipped_page_past_max_page_size_passes_through_whole(self):
        self.origin.route("/page", self.PAGE, gzip=True)
        self.origin.route("/esi/frag", FRAGMENT)
        r = self.fetch("/page")
        self.assertTrue(r.complete, "cut off: %r" % (r,))
        self.assertEqual(r.body, self.PAGE.encode())
        self.assertIn("is larger than esi_max_page_size", self.error_log())


def peak_rss_kib(pid):
    """VmHWM of `pid`: the most resident memory it has had, in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


class InflateFlowControlTest(EsiTestCase):
    """A ratio bomb that falls back is inflated a few buffers ahead of the
    client, not all at once: the worker's peak memory grows by a small
    part of what it sends (it grew by 189 MB for a 200 MB bomb before)."""

    LOCATION = "esi_max_page_size 64k;"

    SIZE = 64 * 1024 * 1024
    # well under SIZE, well over esi_max_page_size and 8 inflate buffers
    GROWTH_KIB = 16 * 1024

    def test_ratio_bomb_past_max_page_size_streams_in_bounded_memory(self):
        self.origin.route("/warm", "<p>warm</p>", gzip=True)
        self.origin.route("/bomb", b"\0" * self.SIZE, gzip=True)
        self.assertTrue(self.fetch("/warm").complete)
        before = {pid: peak_rss_kib(pid) for pid in self.worker_pids()}

        r = self.fetch("/bomb")

        self.assertTrue(r.complete, "cut off after %d bytes" % len(r.body))
        self.assertEqual(len(r.body), self.SIZE)
        self.assertEqual(r.body.count(b"\0"), self.SIZE)
        self.assertIn("is larger than esi_max_page_size", self.error_log())
        growth = max(peak_rss_kib(pid) - kib for pid, kib in before.items())
        self.assertLess(growth, self.GROWTH_KIB)


class SmallSendBufferTest(EsiTestCase):
    """A send buffer far smaller than the gzipped page: the gzip filter
    holds output while the socket is full, and goes on only when the
    writer's call comes through ESI, even when ESI itself holds nothing
    (it did not: the response hung)."""
    LISTEN = " sndbuf=16k"
    LOCATION = GZIP_OUT

    def test_a_large_page_goes_out_whole(self):
        text, h = [], b"seed"
        for _ in range(30000):
            h = hashlib.sha256(h).digest()
            text.append(h.hex())
        page = "\n".join(text) + '<esi:include src="/esi/frag"/>'
        self.origin.route("/big", page)
        self.origin.route("/esi/frag", FRAGMENT)
        for status in ("MISS", "HIT"):
            code, headers, body = self.get("/big", {"Accept-Encoding": "gzip"})
            self.assertEqual(headers.get("X-Cache-Status"), status)
            self.assertEqual(gzip.decompress(body).decode(),
                             page.replace('<esi:include src="/esi/frag"/>',
                                          FRAGMENT))


class SmallInflateBufferTest(EsiTestCase):
    LOCATION = GZIP_OUT + " esi_buffer_size 1k;"

    PAGE, EXPECTED = big_page(300 * 1024)

    def test_large_gzipped_page_assembles_through_1k_buffers(self):
        self.origin.route("/page", self.PAGE, gzip=True)
        self.origin.route("/esi/frag", FRAGMENT)
        self.assertBody("/page", self.EXPECTED)

    def test_large_gzipped_page_is_gzipped_again_for_a_gzip_client(self):
        self.origin.route("/page", self.PAGE, gzip=True)
        self.origin.route("/esi/frag", FRAGMENT)
        _, headers, body = self.get("/page", {"Accept-Encoding": "gzip"})
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        self.assertEqual(gzip.decompress(body), self.EXPECTED)


if __name__ == "__main__":
    unittest.main()
