"""A 4 MB page with includes spread through it assembles byte-exact."""

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


if __name__ == "__main__":
    unittest.main()
