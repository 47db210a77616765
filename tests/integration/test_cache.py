"""The page shell comes from proxy_cache; ESI runs on every delivery."""

import unittest

from harness import EsiTestCase


class CacheTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route(
            "/page", '<h1><esi:include src="/esi/head"/></h1>'
                     '<p><esi:include src="/esi/cart"/></p>')
        self.origin.route("/esi/head", "Shop")
        self.origin.route("/esi/cart",
                          lambda target: "cart %d" %
                          self.origin.hits("/esi/cart"))

    def assertCart(self, n, cache_status):
        """GET /page: 200, the assembled page with cart n, from the cache
        or not as cache_status says."""
        status, headers, body = self.get("/page")
        self.assertEqual((status, headers.get("X-Cache-Status"), body),
                         (200, cache_status,
                          b"<h1>Shop</h1><p>cart %d</p>" % n))

    def test_second_request_is_a_cache_hit(self):
        self.assertCart(1, "MISS")
        self.assertCart(2, "HIT")

    def test_miss_and_hit_are_assembled(self):
        self.assertBody("/page", b"<h1>Shop</h1><p>cart 1</p>")
        self.assertBody("/page", b"<h1>Shop</h1><p>cart 2</p>")

    def test_page_is_fetched_from_the_origin_once(self):
        for n, cache_status in enumerate(("MISS", "HIT", "HIT"), 1):
            self.assertCart(n, cache_status)
        self.assertEqual(self.origin.hits("/page"), 1)

    def test_uncached_fragments_are_fetched_on_every_delivery(self):
        self.assertCart(1, "MISS")
        self.assertCart(2, "HIT")
        self.assertEqual(self.origin.hits("/esi/cart"), 2)
        self.assertEqual(self.origin.hits("/esi/head"), 2)

    def test_cache_hit_is_processed_per_esi_status(self):
        self.assertCart(1, "MISS")
        self.assertCart(2, "HIT")
        self.assertEqual([self.esi_status(1), self.esi_status(2)],
                         ["processed", "processed"])


class CachedFragmentTest(EsiTestCase):
    FRAGMENT_LOCATION = """
            proxy_cache pages;
            proxy_cache_valid 200 10m;
    """

    def test_fragment_cached_in_its_own_location_is_fetched_once(self):
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        self.assertBody("/page", b"aXc")
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.origin.hits("/esi/x"), 1)


if __name__ == "__main__":
    unittest.main()
