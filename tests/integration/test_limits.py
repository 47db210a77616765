"""Limits, each with a directive and a clear line in the error log:
includes per page (esi_max_includes) and per client request
(esi_max_request_includes), a page that includes itself, page
size (esi_max_page_size), tag size (esi_max_tag_size), fragment size
(esi_max_fragment_size); nesting depth is test_markup's."""

import os
import subprocess
import threading
import unittest

from harness import (ERROR_MARKER, NGINX, REQUEST_TIMEOUT, EsiTestCase,
                     free_port, poll)


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


def self_including(target):
    """A page that includes itself three times, with arguments that differ
    at every level: no loop, nothing the cache could answer twice."""
    _, _, query = target.partition("?")
    return "".join('<esi:include src="/s?%s%d"/>' % (query, i)
                   for i in range(3)).encode()


class MaxRequestIncludesTest(EsiTestCase):
    """esi_max_includes bounds one page; at the default esi_max_depth 5 a
    page of three includes of itself makes 3 + 9 + 27 + 81 + 243 = 363."""

    def setUp(self):
        super().setUp()
        self.origin.route("/s", self_including)

    def assertBounded(self, bound):
        self.assertEqual(self.get("/s")[0], 200)
        self.assertEqual(self.origin.hits_under("/s"), 1 + bound)
        self.assertEqual(self.error_log().count(
            "includes of the request \"/s\" (esi_max_request_includes)"), 1)

    def test_the_default_bounds_the_whole_tree_at_256(self):
        self.assertBounded(256)

    def test_the_directive_bounds_it_across_every_level(self):
        self.SERVER = "esi_max_request_includes 20;"
        self.assertBounded(20)


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



def include_tag(length):
    """An include tag of exactly `length` bytes, '<' to '>'."""
    head, tail = '<esi:include src="/esi/', '"/>'
    return head + "a" * (length - len(head) - len(tail)) + tail


TAG_WARNING = "ESI tag longer than maxTagBytes, taken as text"


class TagSizeTestCase(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.prefix("/esi/", "F")

    def assertTag(self, length, parsed):
        page = "a" + include_tag(length) + "b"
        self.origin.route("/p", page)
        self.assertBody("/p", b"aFb" if parsed else page.encode())
        self.assertEqual(self.origin.hits_under("/esi/"), 1 if parsed else 0)
        self.assertEqual(self.esid.stderr().count(TAG_WARNING),
                         0 if parsed else 1)


class DefaultTagSizeTest(TagSizeTestCase):

    def test_a_tag_of_8k_is_parsed(self):
        self.assertTag(8192, parsed=True)

    def test_a_tag_one_byte_longer_is_text(self):
        self.assertTag(8193, parsed=False)

    def test_a_tag_of_1000_bytes_is_parsed(self):
        self.assertTag(1000, parsed=True)


class MaxTagSizeTest(TagSizeTestCase):
    LOCATION = "esi_max_tag_size 300;"

    def test_a_tag_at_the_limit_is_parsed(self):
        self.assertTag(300, parsed=True)

    def test_a_tag_just_below_the_limit_is_parsed(self):
        self.assertTag(299, parsed=True)

    def test_a_tag_just_above_the_limit_is_text(self):
        self.assertTag(301, parsed=False)

    def test_a_tag_the_default_parses_is_text_here(self):
        self.assertTag(1000, parsed=False)

    def test_a_larger_limit_parses_a_tag_the_default_leaves(self):
        self.LOCATION = "esi_max_tag_size 1m;"
        self.assertTag(20000, parsed=True)


class MaxFragmentSizeTest(EsiTestCase):
    SERVER = "esi_max_fragment_size 1k;"
    FRAGMENT = b"".join(b"%04d" % i for i in range(750))  # 3000 bytes

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/small", "S")

    def page(self, attributes):
        self.origin.route("/p", 'a<esi:include src="/esi/big"%s/>b'
                          % attributes)

    def big(self, body, length=True, content_type="text/html"):
        self.origin.route("/esi/big", body, length=length,
                          content_type=content_type)

    def assertRefusedOnce(self, length):
        self.assertEqual(self.error_log().count(
            'esi: include "/esi/big" is larger than esi_max_fragment_size '
            '1024 (Content-Length %d), include failed' % length), 1)

    def assertCutOnce(self):
        self.assertEqual(self.error_log().count(
            'esi: include "/esi/big" is larger than esi_max_fragment_size '
            '1024, the rest of it is discarded'), 1)

    def assertNoLimitLine(self):
        self.assertNotIn("esi_max_fragment_size", self.error_log())

    # Content-Length says so at header time: the include fails.

    def test_too_large_by_content_length_fails_with_the_marker(self):
        self.big(self.FRAGMENT)
        self.page("")
        self.assertBody("/p", b"a" + ERROR_MARKER + b"b")
        self.assertRefusedOnce(3000)

    def test_too_large_by_content_length_falls_back_to_alt(self):
        self.big(self.FRAGMENT)
        self.page(' alt="/esi/small"')
        self.assertBody("/p", b"aSb")
        self.assertRefusedOnce(3000)

    def test_too_large_by_content_length_with_onerror_continue(self):
        self.big(self.FRAGMENT)
        self.page(' onerror="continue"')
        self.assertBody("/p", b"ab")
        self.assertRefusedOnce(3000)

    def test_too_large_with_silent_errors_leaves_nothing(self):
        self.SERVER += "esi_silent_errors on;"
        self.big(self.FRAGMENT)
        self.page("")
        self.assertBody("/p", b"ab")
        self.assertRefusedOnce(3000)

    def test_refused_while_the_include_before_it_is_in_flight(self):
        # Its marker waits in postpone until the include before it is done;
        # it hung there: the flush that sends it was swallowed.
        release = self.origin.hold("/esi/small")
        self.big(self.FRAGMENT)
        self.origin.route("/p", 'a<esi:include src="/esi/small"/>b'
                                '<esi:include src="/esi/big"/>c')
        self.start()
        answers = []
        client = threading.Thread(
            target=lambda: answers.append(self.fetch("/p")), daemon=True)
        client.start()
        self.assertTrue(poll(lambda: 'include "/esi/big" is larger' in
                             self.error_log()))
        release.set()
        client.join(REQUEST_TIMEOUT + 10)
        self.assertTrue(answers and answers[0].complete, answers)
        self.assertEqual(answers[0].body, b"aSb" + ERROR_MARKER + b"c")
        self.assertRefusedOnce(3000)

    def test_fragment_at_the_limit_is_included(self):
        self.big(self.FRAGMENT[:1024])
        self.page("")
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertNoLimitLine()

    # No Content-Length: what is past the limit is discarded.

    def test_growing_past_the_limit_is_cut_there(self):
        self.big(self.FRAGMENT, length=False)
        self.page("")
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertCutOnce()

    def test_a_cut_fragment_is_not_replaced_by_alt(self):
        self.big(self.FRAGMENT, length=False)
        self.page(' alt="/esi/small"')
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertEqual(self.origin.hits("/esi/small"), 0)
        self.assertCutOnce()

    def test_a_cut_fragment_with_onerror_continue(self):
        self.big(self.FRAGMENT, length=False)
        self.page(' onerror="continue"')
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertCutOnce()

    def test_a_cut_fragment_that_is_not_esi_processed(self):
        self.big(self.FRAGMENT, length=False, content_type="text/plain")
        self.page("")
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertCutOnce()

    def test_markup_past_the_cut_is_never_seen(self):
        self.big(self.FRAGMENT + b'<esi:include src="/esi/small"/>',
                 length=False)
        self.page("")
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertEqual(self.origin.hits("/esi/small"), 0)

    def test_fragment_at_the_limit_without_length_is_included(self):
        self.big(self.FRAGMENT[:1024], length=False)
        self.page("")
        self.assertBody("/p", b"a" + self.FRAGMENT[:1024] + b"b")
        self.assertNoLimitLine()

    def test_the_page_goes_on_after_a_cut_fragment(self):
        self.big(self.FRAGMENT, length=False)
        self.origin.route("/p", '<esi:include src="/esi/big"/>|'
                                '<esi:include src="/esi/small"/>|end')
        self.assertBody("/p", self.FRAGMENT[:1024] + b"|S|end")
        self.assertCutOnce()


class LargeFragmentTest(EsiTestCase):
    """A fragment far larger than NGINX's buffers, cut in a later buffer;
    the default 16m leaves it whole."""

    FRAGMENT = b"".join(b"%07d\n" % i for i in range(40000))  # 320,000 bytes

    def setUp(self):
        super().setUp()
        self.origin.route("/p", 'a<esi:include src="/esi/big"/>b')
        self.origin.route("/esi/big", self.FRAGMENT, length=False,
                          content_type="text/plain")

    def test_cut_past_many_buffers(self):
        self.SERVER = "esi_max_fragment_size 100001;"
        self.assertBody("/p", b"a" + self.FRAGMENT[:100001] + b"b")
        self.assertIn("esi_max_fragment_size 100001, the rest of it is "
                      "discarded", self.error_log())

    def test_cut_in_a_fragment_that_is_esi_processed(self):
        # Its own stream must still see the end of its input, or the page
        # would wait for it for ever.
        self.SERVER = "esi_max_fragment_size 100001;"
        self.origin.route("/esi/big", self.FRAGMENT, length=False)
        self.assertBody("/p", b"a" + self.FRAGMENT[:100001] + b"b")
        self.assertIn("esi_max_fragment_size 100001, the rest of it is "
                      "discarded", self.error_log())

    def test_the_default_leaves_it_whole(self):
        self.assertBody("/p", b"a" + self.FRAGMENT + b"b")

    def test_zero_means_no_limit(self):
        self.SERVER = "esi_max_fragment_size 0;"
        self.origin.route("/esi/big", self.FRAGMENT)
        self.assertBody("/p", b"a" + self.FRAGMENT + b"b")


class ConfigurationErrorTest(EsiTestCase):
    """Out-of-range values stop `nginx -t` with a line naming the
    directive and the range."""

    def nginx_t(self, snippet):
        self.LOCATION = snippet
        self.port = free_port()
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(self.nginx_conf())
        log = os.path.join(self.tmp, "conftest.log")
        # A sanitized nginx: its reports go where the harness reads them.
        # nginx -t exits on a bad configuration without freeing its first
        # pool (nginx.c, main), which is NGINX's way, not a leak of ours.
        env = self.sanitizer_env()
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"] + ":detect_leaks=0"
        r = subprocess.run(
            [NGINX, "-t", "-p", self.tmp + "/", "-e", log, "-c", conf],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
            env=env)
        return r.returncode, r.stderr.decode()

    def test_tag_size_below_256_is_refused(self):
        code, out = self.nginx_t("esi_max_tag_size 255;")
        self.assertNotEqual(code, 0)
        self.assertIn('"esi_max_tag_size" directive must be between 256 '
                      'and 1m', out)

    def test_tag_size_above_1m_is_refused(self):
        code, out = self.nginx_t("esi_max_tag_size 1025k;")
        self.assertNotEqual(code, 0)
        self.assertIn('"esi_max_tag_size" directive must be between 256 '
                      'and 1m', out)

    def test_tag_size_bounds_are_accepted(self):
        for value in ("256", "1m"):
            code, out = self.nginx_t("esi_max_tag_size %s;" % value)
            self.assertEqual(code, 0, out)

    def test_fragment_size_that_is_no_size_is_refused(self):
        code, out = self.nginx_t("esi_max_fragment_size -1;")
        self.assertNotEqual(code, 0)
        self.assertIn('"esi_max_fragment_size" directive invalid value', out)


if __name__ == "__main__":
    unittest.main()
