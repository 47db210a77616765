"""SSRF and injection through <esi:include src>, proven on the real thing:
every src that names another authority, in any disguise, carries CR, LF or
NUL, or climbs above the root is refused or normalised.  Each test asserts
what the origins received (every request line and header), the exact bytes
the client got, and, for a refusal, why esid refused it."""

import os
import unittest

from harness import ERROR_MARKER, EsiTestCase
from origin import Origin


def logged(src):
    """src as esid logs it: quoted, escaped as fmt's {:?} does."""
    escapes = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n",
               "\t": "\\t"}
    return '"%s"' % "".join(
        escapes.get(c, c if " " <= c < "\x7f" else "\\x%02x" % ord(c))
        for c in src)


class SsrfTestCase(EsiTestCase):
    """The page is /p; whatever else reaches the origin answers with its own
    request target, so a fetch of anything unexpected shows in the body."""

    def setUp(self):
        super().setUp()
        # Another server on loopback: no include may reach it.
        self.other = Origin(os.path.join(self.tmp, "other-origin.log"))
        self.addCleanup(self.other.close)
        self.other.prefix("/", lambda target: "OTHER " + target)
        self.origin.prefix("/", lambda target: "[" + target + "]")
        self.origin.route("/esi/x", "X")

    def page(self, src):
        self.origin.route("/p", 'a<esi:include src="%s"/>b' % src)

    def received(self):
        """Request targets the origin saw; none may carry an injected
        header, and the other origin must have seen nothing."""
        requests = self.origin.requests()
        for method, target, headers in requests:
            self.assertNotIn("x-injected", [h.lower() for h in headers],
                             "%s %s" % (method, target))
        self.assertEqual(self.other.requests(), [])
        return [(method, target) for method, target, _ in requests]

    def assertRefused(self, src, reason, decoded=None):
        """decoded: src once its entities are decoded, if it has any."""
        self.page(src)
        self.assertBody("/p", b"a" + ERROR_MARKER + b"b")
        self.assertEqual(self.received(), [("GET", "/p")])
        self.assertIn('"/p": include %s refused: %s' % (
            logged(decoded or src), reason), self.esid.stderr())
        self.assertIn("esi: include refused by esid", self.error_log())
        # No line of esid's log may be forged by a CR or LF in src.
        self.assertNotIn("\nX-Injected", self.esid.stderr())

    def assertFetched(self, src, target, body):
        self.page(src)
        self.assertBody("/p", b"a" + body + b"b")
        self.assertEqual(self.received(), [("GET", "/p"), ("GET", target)])
        self.assertNotIn("refused", self.esid.stderr())


class OtherAuthorityTest(SsrfTestCase):

    def test_userinfo_naming_this_host_before_another(self):
        self.assertRefused("http://127.0.0.1@evil.example/x",
                           "userinfo in authority")

    def test_userinfo_before_this_very_server(self):
        self.start()
        self.assertRefused("http://evil.example@%s/esi/x" % self.host,
                           "userinfo in authority")

    def test_scheme_relative(self):
        self.assertRefused("//evil.example/x",
                           "authority other than the page's")

    def test_two_backslashes(self):
        self.assertRefused("\\\\evil.example\\x", "backslash in path")

    def test_slash_backslash(self):
        self.assertRefused("/\\evil.example/x", "backslash in path")

    def test_percent_encoded_host(self):
        self.assertRefused("http://%65vil.example/x",
                           "authority other than the page's")

    def test_ipv6_loopback_with_this_port(self):
        self.start()
        self.assertRefused("http://[::1]:%d/esi/x" % self.port,
                           "authority other than the page's")

    def test_ipv4_mapped_ipv6_loopback(self):
        self.assertRefused("http://[::ffff:7f00:1]/esi/x",
                           "authority other than the page's")

    def test_upper_case_scheme_and_host(self):
        self.assertRefused("HTTP://EVIL.example/x",
                           "authority other than the page's")

    def test_another_server_on_loopback(self):
        self.assertRefused("hTtP://127.0.0.1:%d/x" % self.other.port,
                           "authority other than the page's")

    def test_other_scheme(self):
        self.assertRefused("file:///etc/passwd",
                           "scheme other than http or https")


class OwnAuthorityTest(SsrfTestCase):
    """An absolute URL naming the page's own Host is fetched on the same
    server, as a local path."""

    def test_http_url(self):
        self.start()
        self.assertFetched("http://%s/esi/x" % self.host, "/esi/x", b"X")

    def test_mixed_case_scheme(self):
        self.start()
        self.assertFetched("hTtP://%s/esi/x" % self.host, "/esi/x", b"X")

    def test_scheme_relative(self):
        self.start()
        self.assertFetched("//%s/esi/x" % self.host, "/esi/x", b"X")


class InjectionTest(SsrfTestCase):
    """CR, LF or NUL in the path would split the subrequest's request line;
    such a src is refused however it is spelt."""

    def test_raw_crlf(self):
        self.assertRefused("/esi/x\r\nX-Injected: 1",
                           "control character in path")

    def test_percent_encoded_crlf(self):
        self.assertRefused("/esi/x%0d%0aX-Injected:%201",
                           "control character in path")

    def test_decimal_entity_crlf(self):
        self.assertRefused("/esi/x&#13;&#10;X-Injected: 1",
                           "control character in path",
                           decoded="/esi/x\r\nX-Injected: 1")

    def test_hexadecimal_entity_crlf(self):
        self.assertRefused("/esi/x&#x0d;&#x0a;X-Injected: 1",
                           "control character in path",
                           decoded="/esi/x\r\nX-Injected: 1")

    def test_raw_crlf_in_the_query(self):
        self.assertRefused("/esi/x?a=1 HTTP/1.1\r\nX-Injected: 1",
                           "control character or space in args")

    def test_percent_encoded_crlf_in_the_query_stays_encoded(self):
        self.assertFetched("/esi/x?a=%0d%0aX-Injected:%201",
                           "/esi/x?a=%0d%0aX-Injected:%201", b"X")

    def test_percent_encoded_nul(self):
        self.assertRefused("/esi/x%00.html", "control character in path")

    def test_nul_entity_is_no_entity_and_stays_text(self):
        # XML has no &#0;: it stays as written, and its '#' starts the
        # URI's fragment, which is not sent.
        self.assertFetched("/esi/x&#0;", "/esi/x&", b"[/esi/x&]")

    def test_hexadecimal_nul_entity_too(self):
        self.assertFetched("/esi/x&#x0;y", "/esi/x&", b"[/esi/x&]")


class TraversalTest(SsrfTestCase):
    """Dot-segments are removed as RFC 3986 says; one that would climb above
    the root is refused rather than quietly stopped there."""

    def test_relative_climb(self):
        self.assertRefused("../../../etc/passwd",
                           "path climbs above the root")

    def test_absolute_climb(self):
        self.assertRefused("/a/../../secret", "path climbs above the root")

    def test_percent_encoded_dots(self):
        self.assertRefused("%2e%2e/secret", "path climbs above the root")

    def test_percent_encoded_slash(self):
        self.assertRefused("..%2fsecret", "path climbs above the root")

    def test_dots_backslash(self):
        self.assertRefused("..\\secret", "backslash in path")

    def test_dot_segments_inside_the_root_are_removed(self):
        self.assertFetched("/esi/a/../x", "/esi/x", b"X")

    def test_encoded_dot_segments_inside_the_root_are_removed(self):
        self.assertFetched("/esi/%2e%2e/x", "/x", b"[/x]")

    def test_relative_src_resolves_against_the_page(self):
        self.origin.route("/esi/d/p", 'a<esi:include src="../x"/>b')
        self.assertBody("/esi/d/p", b"aXb")
        self.assertEqual(self.received(),
                         [("GET", "/esi/d/p"), ("GET", "/esi/x")])


if __name__ == "__main__":
    unittest.main()
