"""Gzipped pages in the builds of tests/build-matrix.sh, which sets
ESI_MATRIX_ZLIB: 1 for an nginx that has zlib but not the gzip module (the
module inflates by itself), 0 for an nginx without zlib (the module leaves
gzipped pages unprocessed and says so).  Skipped anywhere else."""

import gzip
import os
import unittest

from harness import EsiTestCase

ZLIB = os.environ.get("ESI_MATRIX_ZLIB")
PAGE = 'a<esi:include src="/esi/x"/>c'


@unittest.skipIf(ZLIB is None, "run by tests/build-matrix.sh")
class GzippedPageTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE, gzip=True)
        self.origin.route("/esi/x", "X")

    @unittest.skipUnless(ZLIB == "1", "nginx without zlib")
    def test_gzipped_page_is_inflated_without_the_gzip_module(self):
        _, headers, body = self.get("/page")
        self.assertIsNone(headers.get("Content-Encoding"))
        self.assertEqual(body, b"aXc")

    @unittest.skipUnless(ZLIB == "0", "nginx with zlib")
    def test_gzipped_page_passes_unprocessed_without_zlib(self):
        _, headers, body = self.get("/page")
        self.assertEqual(headers.get("Content-Encoding"), "gzip")
        self.assertEqual(gzip.decompress(body), PAGE.encode())
        self.assertIn('esi: "gzip" encoded response left unprocessed: '
                      'nothing is decoded (no zlib)', self.error_log())


if __name__ == "__main__":
    unittest.main()
