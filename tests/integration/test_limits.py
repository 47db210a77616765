"""Limits, each with a directive and a clear line in the error log:
includes per page (esi_max_includes), a page that includes itself, page
size (esi_max_page_size); nesting depth is test_markup's."""

import unittest

from harness import ERROR_MARKER, EsiTestCase


class MaxIncludesTest(EsiTestCase):
    LOCATION = "esi_max_includes 3;"

    def test_includes_past_the_limit_fail_and_are_logged_once(self):
        self.origin.route("/p", "".join(
            '<esi:include src="/esi/%d"/>' % i for i in range(5)))
        for i in range(5):
            self.origin.route("/esi/%d" % i, str(i))
        self.assertBody("/p", b"012" + ERROR_MARKER * 2)
        self.assertEqual(self.origin.hits("/esi/3"), 0)
        self.assertEqual(self.error_log().count(
            '"/p" has more than 3 includes (esi_max_includes)'), 1)


class SelfIncludeTest(EsiTestCase):

    def test_a_page_that_includes_itself_is_refused_at_once(self):
        self.origin.route("/loop", 'a<esi:include src="/loop"/>b')
        self.assertBody("/loop", b"a" + ERROR_MARKER + b"b")
        self.assertEqual(self.origin.hits("/loop"), 1)
        self.assertIn('include "/loop" would include itself (a loop)',
                      self.error_log())

    def test_a_loop_through_a_fragment_is_refused_too(self):
        self.origin.route("/p", 'a<esi:include src="/esi/f"/>b')
        self.origin.route("/esi/f", 'f<esi:include src="/p"/>')
        self.assertBody("/p", b"af" + ERROR_MARKER + b"b")
        self.assertIn('include "/p" would include itself', self.error_log())


class MaxPageSizeTest(EsiTestCase):
    LOCATION = "esi_max_page_size 1k;"

    def test_a_larger_page_falls_back_with_its_markup_intact(self):
        body = "x" * 4096 + '<esi:include src="/esi/a"/>'
        self.origin.route("/big", body)
        self.origin.route("/esi/a", "A")
        self.assertBody("/big", body.encode())
        self.assertIn('"/big" is larger than esi_max_page_size 1024',
                      self.error_log())
        self.assertEqual(self.esi_status(1), "passthrough")

    def test_a_smaller_page_is_processed(self):
        self.origin.route("/small", 'a<esi:include src="/esi/a"/>')
        self.origin.route("/esi/a", "A")
        self.assertBody("/small", b"aA")


if __name__ == "__main__":
    unittest.main()
