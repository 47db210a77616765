"""A 4 MB page with includes spread through it assembles byte-exact; so
does a page read into a single small buffer."""

import random
import unittest

from harness import EsiTestCase

SIZE = 4 * 1024 * 1024


def make_page(size, every, seed=1):
    """Markup-dense filler with an include about every `every` bytes.

    Returns (page, expected, include count)."""
    rng = random.Random(seed)
    words = ["<p>", "</p>", "<div class=\"x\">", "</div>", "<!-- c -->",
             "a < b", "<e", "<es", "<esi", "&amp;", "text ", "\n"]
    page, expected = [], []
    length, n = 0, 0
    while length < size:
        chunk = "".join(rng.choice(words) for _ in range(every // 6))
        page.append(chunk)
        expected.append(chunk)
        page.append('<esi:include src="/esi/big/%d"/>' % n)
        expected.append("[fragment %d]" % n)
        length += len(chunk) + 32
        n += 1
    page.append("<p>end</p>\n")
    expected.append("<p>end</p>\n")
    return "".join(page).encode(), "".join(expected).encode(), n


class LargePageTest(EsiTestCase):

    def test_4mb_page_with_includes_is_assembled_exactly(self):
        page, expected, n = make_page(SIZE, 64 * 1024)
        self.origin.prefix(
            "/esi/big/",
            lambda target: "[fragment %s]" % target.rsplit("/", 1)[1])
        self.origin.route("/big", page)
        status, _, body = self.get("/big")
        self.assertEqual(status, 200)
        self.assertEqual(len(body), len(expected))
        self.assertTrue(body == expected, "assembled page differs")
        self.assertEqual(self.origin.hits_under("/esi/big/"), n)

    def test_4mb_page_from_cache_is_assembled_exactly(self):
        page, expected, _ = make_page(SIZE, 256 * 1024, seed=2)
        self.origin.prefix(
            "/esi/big/",
            lambda target: "[fragment %s]" % target.rsplit("/", 1)[1])
        self.origin.route("/big", page)
        self.get("/big")
        status, headers, body = self.get("/big")
        self.assertEqual(headers.get("X-Cache-Status"), "HIT")
        self.assertEqual(len(body), len(expected))
        self.assertTrue(body == expected, "assembled page differs")

    def test_4mb_page_without_markup_is_delivered_unchanged(self):
        rng = random.Random(3)
        page = bytes(rng.choices(b"<>abc d!-\n", k=SIZE))
        self.origin.route("/plain-big", page)
        status, _, body = self.get("/plain-big")
        self.assertEqual(status, 200)
        self.assertTrue(body == page, "page differs")
        # parsed whole by esid, not passed through
        self.assertEqual(self.esi_status(1), "processed")
        stats = self.stats()
        self.assertEqual((stats["streams"], stats["bytes"],
                          stats["warnings"]), (1, SIZE, 0), stats)


class OneOutputBufferTest(EsiTestCase):
    """output_buffers 1 (many tuned configurations still say so): the body
    is read into one buffer, which comes back only when the module lets go
    of it.  Whenever the module waits for more body it holds copies of what
    it has not released and flushes output that points into the buffer;
    else a construct, a check or a try across the buffer's edge, or a last
    piece of output shorter than postpone_output, stalls the page."""

    HTTP = "esi_plan_zone plans:4m;"
    LOCATION = "output_buffers 1 4k;\n            esi_plan plans;"

    def setUp(self):
        super().setUp()
        self.origin.prefix(
            "/esi/big/",
            lambda target: "[fragment %s]" % target.rsplit("/", 1)[1])

    def assertAssembled(self, path, page, expected, hits=3):
        self.origin.route(path, page)
        for status in ["MISS"] + ["HIT"] * hits:
            _, headers, body = self.get(path)
            self.assertEqual(headers.get("X-Cache-Status"), status)
            self.assertTrue(body == expected, "%s: assembled page differs"
                            % status)

    def test_includes_across_the_buffers_edges(self):
        page, expected, _ = make_page(200 * 1024, 2000, seed=4)
        self.assertAssembled("/many", page, expected)
        self.assertEqual(self.stats_json()["planned"], 2)

    def test_tries_across_the_buffers_edges(self):
        attempt = ('<esi:try><esi:attempt>%s<esi:include src="/esi/big/%d"/>'
                   '</esi:attempt><esi:except>E</esi:except></esi:try>')
        page = "".join("<p>%s</p>" % ("x" * (900 + i)) + attempt % (
            "y" * (3000 + i), i) for i in range(40))
        expected = "".join("<p>%s</p>%s[fragment %d]" % (
            "x" * (900 + i), "y" * (3000 + i), i) for i in range(40))
        self.assertAssembled("/tries", page.encode(), expected.encode())
        self.assertEqual(self.stats_json()["planned"], 2)


if __name__ == "__main__":
    unittest.main()
