"""Compression around ESI: gunzip below the module, gzip above it."""

import gzip
import unittest

from harness import EsiTestCase, add_http2_variants

PAGE = 'a<esi:include src="/esi/x"/>c'


class GunzipTest(EsiTestCase):
    LOCATION = "gunzip on;"

    def test_gzipped_page_is_gunzipped_then_processed(self):
        # The client does not accept gzip, so nginx's gunzip decodes the
        # upstream body before ESI sees it.
        self.origin.route("/page", PAGE, gzip=True)
        self.origin.route("/esi/x", "X")
        _, headers, body = self.get("/page")
        self.assertIsNone(headers.get("Content-Encoding"))
        self.assertEqual(body, b"aXc")


class GzipTest(EsiTestCase):
    LOCATION = "gzip on; gzip_min_length 1;"

    def test_assembled_page_is_gzipped_for_a_gzip_client(self):
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")
        _, headers, body = self.get("/page", {"Accept-Encoding": "gzip"})
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        self.assertEqual(gzip.decompress(body), b"aXc")


add_http2_variants(globals())

if __name__ == "__main__":
    unittest.main()
