"""esictl log: esid's trace of what it did, page by page and purge by
purge, from a ring of fixed size.  `--dump` prints what esid holds; the
filters keep pages of one status or URL prefix; a reader that stops
reading never holds esid up."""

import json
import os
import signal

from harness import ESICTL, EsiTestCase, poll
from esitest import read_text

LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
"""


class LogTest(EsiTestCase):
    LOCATION = LOCATION

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/a", "A", content_type="text/plain")
        self.origin.route("/shop/cart", 'c<esi:include src="/esi/a"/><esi:include src="/esi/a"/>')
        self.origin.route("/shop/gone", 'g<esi:include src="/esi/a"/>', status=404)
        self.origin.route("/news", "plain news")

    def dump(self, *args):
        r = self.esictl("log", "--dump", "--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return [json.loads(line) for line in r.stdout.decode().splitlines()]

    def test_dump_shows_each_page_and_purge_with_its_fields(self):
        self.assertEqual(self.get("/shop/cart")[2], b"cAA")
        self.assertEqual(self.get("/shop/gone")[0], 404)
        self.assertEqual(self.get("/news")[2], b"plain news")
        r = self.fetch("/news", method="PURGE")
        self.assertEqual(r.status, 200, r.body)
        entries = self.dump()
        pages = [e for e in entries if e["kind"] == "page"]
        self.assertEqual([(e["url"], e["status"], e["how"], e["fragments"])
                          for e in pages],
                         [("/shop/cart", 200, "parse", 2), ("/shop/gone", 404, "parse", 1),
                          ("/news", 200, "parse", 0)])
        self.assertEqual([e["bytes"] for e in pages],
                         [len('c<esi:include src="/esi/a"/><esi:include src="/esi/a"/>'),
                          len('g<esi:include src="/esi/a"/>'), len("plain news")])
        self.assertEqual([e["seq"] for e in entries], sorted(e["seq"] for e in entries))
        purges = [e for e in entries if e["kind"] == "purge"]
        self.assertEqual(len(purges), 1, entries)
        self.assertEqual((purges[0]["url"], purges[0]["how"], purges[0]["zone"],
                          purges[0]["files"], purges[0]["error"]),
                         ("/news", "exact", "pages", 1, ""))
        self.assertIn(purges[0]["path"], ("index", "directory"))
        # The text form: one line per entry, the URL quoted.
        r = self.esictl("log", "--dump")
        lines = r.stdout.decode().splitlines()
        self.assertEqual(len(lines), 4, lines)
        self.assertRegex(lines[1], r'^\d\d:\d\d:\d\d\.\d{3} page 404 parse "/shop/gone" '
                                   r'fragments=1 bytes=28 time=\d+us$')
        self.assertRegex(lines[3], r'^\d\d:\d\d:\d\d\.\d{3} purge exact "/news" zone=pages '
                                   r'files=1 path=(index|directory) time=\d+us$')

    def test_filters_keep_one_status_and_one_prefix(self):
        for path in ("/shop/cart", "/shop/gone", "/news", "/shop/cart"):
            self.get(path)
        self.assertEqual([e["url"] for e in self.dump("--prefix", "/shop")],
                         ["/shop/cart", "/shop/gone", "/shop/cart"])
        self.assertEqual([e["url"] for e in self.dump("--status", "404")], ["/shop/gone"])
        self.assertEqual([e["url"] for e in self.dump("--prefix", "/shop", "--status", "200")],
                         ["/shop/cart", "/shop/cart"])
        self.assertEqual(self.dump("--prefix", "/nothing"), [])

    def test_follow_prints_what_comes_after_it_started(self):
        self.get("/news")  # before: not shown
        follower = self.spawn("esictl-log", [ESICTL, "--socket", self.socket_path, "log",
                                             "--status", "404"])
        # It says where it starts once esid told it.
        self.assertTrue(poll(lambda: "following esid's trace after entry 1"
                             in follower.stderr()), follower.stderr())
        self.get("/shop/cart")
        self.get("/shop/gone")
        out = os.path.join(self.tmp, "esictl-log.stdout")
        self.assertTrue(poll(lambda: '"/shop/gone"' in read_text(out)))
        text = read_text(out)
        self.assertNotIn("/news", text)
        self.assertNotIn("/shop/cart", text)
        follower.stop()

    def test_a_stopped_reader_never_holds_pages_up(self):
        self.start()
        follower = self.spawn("esictl-log", [ESICTL, "--socket", self.socket_path, "log"])
        self.assertTrue(poll(lambda: "following esid's trace" in follower.stderr()),
                        follower.stderr())
        # Stopped wherever it is, perhaps with a question asked and its
        # answer unread: esid must serve on regardless.
        os.kill(follower.pid, signal.SIGSTOP)
        try:
            for i in range(50):
                status, _, body = self.get("/shop/cart?n=%d" % i)
                self.assertEqual((status, body), (200, b"cAA"), i)
            self.assertEqual(len(self.dump("--prefix", "/shop/cart")), 50)
        finally:
            os.kill(follower.pid, signal.SIGCONT)
        follower.stop()
