"""Response headers of processed pages, and what is left alone."""

import unittest

from harness import EsiTestCase

PAGE = 'a<esi:include src="/esi/x"/>c'
ORIGIN_HEADERS = (
    ("ETag", '"v1"'),
    ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ("Surrogate-Control", 'content="ESI/1.0"'),
)


class ProcessedHeadersTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")
        self.origin.route("/page", PAGE, headers=ORIGIN_HEADERS)

    def test_processed_page_has_no_content_length_and_is_chunked(self):
        _, headers, body = self.get("/page")
        self.assertEqual(body, b"aXc")
        self.assertIsNone(headers.get("Content-Length"))
        self.assertEqual(headers.get("Transfer-Encoding"), "chunked")

    def test_processed_page_has_no_etag_or_last_modified(self):
        _, headers, body = self.get("/page")
        self.assertEqual(body, b"aXc")
        self.assertIsNone(headers.get("ETag"))
        self.assertIsNone(headers.get("Last-Modified"))

    def test_surrogate_control_is_stripped(self):
        _, headers, body = self.get("/page")
        self.assertEqual(body, b"aXc")
        self.assertIsNone(headers.get("Surrogate-Control"))

    def test_range_request_gets_the_whole_processed_page(self):
        status, headers, body = self.get("/page", {"Range": "bytes=0-0"})
        self.assertEqual(status, 200)
        self.assertEqual(body, b"aXc")
        self.assertIsNone(headers.get("Content-Range"))

    def test_processed_page_logs_esi_status_processed(self):
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.esi_status(1), "processed")


class PassThroughTest(EsiTestCase):
    LOCATIONS = """
        location /raw/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            esi off;
        }
    """

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")

    def test_text_plain_passes_through_with_markup_intact(self):
        self.origin.route("/page.txt", PAGE, content_type="text/plain",
                          headers=ORIGIN_HEADERS)
        _, headers, body = self.get("/page.txt")
        self.assertEqual(body, PAGE.encode())
        self.assertEqual(headers.get("Content-Length"), str(len(PAGE)))
        self.assertEqual(headers.get("ETag"), '"v1"')
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_application_json_passes_through_with_markup_intact(self):
        doc = '{"html": "<esi:include src=\\"/esi/x\\"/>"}'
        self.origin.route("/doc.json", doc, content_type="application/json")
        self.assertBody("/doc.json", doc.encode())
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_esi_off_location_passes_through(self):
        self.origin.route("/raw/page", PAGE)
        _, headers, body = self.get("/raw/page")
        self.assertEqual(body, PAGE.encode())
        self.assertEqual(headers.get("Content-Length"), str(len(PAGE)))
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_html_with_charset_parameter_is_processed(self):
        self.origin.route("/page", PAGE,
                          content_type="text/html; charset=utf-8")
        self.assertBody("/page", b"aXc")

    def test_not_processed_page_logs_an_empty_esi_status(self):
        self.origin.route("/page.txt", PAGE, content_type="text/plain")
        self.assertBody("/page.txt", PAGE.encode())
        self.assertIn(self.esi_status(1), ("", "-"))


class EsiTypesTestCase(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")


class EsiTypesTest(EsiTypesTestCase):
    # Like ssi_types and sub_filter_types: the listed types are processed
    # in addition to text/html.
    LOCATION = "esi_types application/xhtml+xml;"

    def test_listed_type_is_processed(self):
        self.origin.route("/page.xhtml", PAGE,
                          content_type="application/xhtml+xml")
        self.assertBody("/page.xhtml", b"aXc")

    def test_text_html_is_processed_in_addition_to_listed_types(self):
        self.origin.route("/page", PAGE)
        self.assertBody("/page", b"aXc")

    def test_unlisted_type_passes_through(self):
        self.origin.route("/page.txt", PAGE, content_type="text/plain")
        self.assertBody("/page.txt", PAGE.encode())



class EsiTypesAnyTest(EsiTypesTestCase):
    LOCATION = "esi_types *;"

    def test_every_type_is_processed(self):
        for path, content_type in (("/page.txt", "text/plain"),
                                   ("/page.json", "application/json"),
                                   ("/page.bin", "")):
            self.origin.route(path, PAGE, content_type=content_type)
            self.assertBody(path, b"aXc")

if __name__ == "__main__":
    unittest.main()
