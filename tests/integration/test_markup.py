"""ESI markup through real nginx + esid: one construct per test, exact bytes.

Default configuration (harness.NGINX_CONF): `location /` proxies the origin
with proxy_cache and `esi on`; `location /esi/` proxies the origin uncached
with `esi on`.
"""

import unittest

from harness import ERROR_MARKER, EsiTestCase, add_http2_variants


class IncludeTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")
        # /esi/echo... answers with the request target it received.
        self.origin.prefix("/esi/echo", lambda target: "[%s]" % target)

    def test_absolute_src_is_replaced_by_the_fragment(self):
        self.origin.route("/page", '<p>a<esi:include src="/esi/x"/>c</p>')
        self.assertBody("/page", b"<p>aXc</p>")

    def test_include_with_closing_tag_is_replaced_by_the_fragment(self):
        self.origin.route("/page",
                          'a<esi:include src="/esi/x"></esi:include>c')
        self.assertBody("/page", b"aXc")

    def test_relative_src_resolves_against_the_page_uri(self):
        self.origin.route("/shop/page", 'a<esi:include src="frag"/>c')
        self.origin.route("/shop/frag", "F")
        self.assertBody("/shop/page", b"aFc")

    def test_relative_src_with_dot_segments_is_normalised(self):
        self.origin.route("/shop/cat/page", 'a<esi:include src="../frag"/>c')
        self.origin.route("/shop/frag", "F")
        self.assertBody("/shop/cat/page", b"aFc")

    def test_query_args_are_kept(self):
        self.origin.route("/page", 'a<esi:include src="/esi/echo?id=7"/>c')
        self.assertBody("/page", b"a[/esi/echo?id=7]c")

    def test_amp_entity_in_src_is_decoded(self):
        self.origin.route(
            "/page", 'a<esi:include src="/esi/echo?x=1&amp;y=2"/>c')
        self.assertBody("/page", b"a[/esi/echo?x=1&y=2]c")

    def test_percent_encoded_path_is_decoded(self):
        self.origin.route("/page", 'a<esi:include src="/esi/%78"/>c')
        self.assertBody("/page", b"aXc")

    def test_single_quoted_src_is_included(self):
        self.origin.route("/page", "a<esi:include src='/esi/x'/>c")
        self.assertBody("/page", b"aXc")

    def test_same_authority_absolute_url_is_included(self):
        self.start()
        self.origin.route(
            "/page", 'a<esi:include src="http://%s/esi/x"/>c' % self.host)
        self.assertBody("/page", b"aXc")

    def test_same_authority_https_url_is_included(self):
        self.start()
        self.origin.route(
            "/page", 'a<esi:include src="https://%s/esi/x"/>c' % self.host)
        self.assertBody("/page", b"aXc")

    def test_same_authority_scheme_relative_url_is_included(self):
        self.start()
        self.origin.route(
            "/page", 'a<esi:include src="//%s/esi/x"/>c' % self.host)
        self.assertBody("/page", b"aXc")

    def test_other_authority_is_refused_with_the_error_marker(self):
        self.origin.route(
            "/page", 'a<esi:include src="http://evil.example/esi/x"/>c')
        self.assertBody("/page", b"a" + ERROR_MARKER + b"c")
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_alt_is_fetched_when_src_is_404(self):
        self.origin.route("/esi/missing", "gone", status=404)
        self.origin.route(
            "/page",
            'a<esi:include src="/esi/missing" alt="/esi/x"/>c')
        self.assertBody("/page", b"aXc")

    def test_alt_is_not_fetched_when_src_succeeds(self):
        self.origin.route("/esi/alt", "ALT")
        self.origin.route(
            "/page", 'a<esi:include src="/esi/x" alt="/esi/alt"/>c')
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.origin.hits("/esi/alt"), 0)

    def test_onerror_continue_leaves_nothing_for_a_500(self):
        self.origin.route("/esi/broken", "boom", status=500)
        self.origin.route(
            "/page",
            'a<esi:include src="/esi/broken" onerror="continue"/>c')
        self.assertBody("/page", b"ac")

    def test_404_fragment_without_alt_or_onerror_is_inlined(self):
        self.origin.route("/esi/missing", "nf", status=404)
        self.origin.route("/page", 'a<esi:include src="/esi/missing"/>c')
        self.assertBody("/page", b"anfc")

    def test_includes_are_assembled_in_document_order(self):
        for name in "pqrs":
            self.origin.route("/esi/" + name, name.upper())
        self.origin.route("/page", "".join(
            '%d<esi:include src="/esi/%s"/>' % (i, n)
            for i, n in enumerate("pqrs")) + "end")
        self.assertBody("/page", b"0P1Q2R3Send")

    def test_page_ending_with_an_include_is_assembled(self):
        self.origin.route("/page", "a" * 16384 + '<esi:include src="/esi/x"/>')
        self.assertBody("/page", b"a" * 16384 + b"X")

    def test_page_made_only_of_includes_is_assembled(self):
        for name in "pq":
            self.origin.route("/esi/" + name, name.upper())
        self.origin.route("/page", '<esi:include src="/esi/p"/>'
                                   '<esi:include src="/esi/q"/>')
        self.assertBody("/page", b"PQ")

    def test_fragment_with_esi_is_itself_processed(self):
        self.origin.route("/esi/outer",
                          '(o<esi:include src="/esi/inner"/>o)')
        self.origin.route("/esi/inner", "I")
        self.origin.route("/page", 'a<esi:include src="/esi/outer"/>c')
        self.assertBody("/page", b"a(oIo)c")


class SilentErrorsTest(EsiTestCase):
    LOCATION = "esi_silent_errors on;"

    def test_refused_authority_leaves_nothing_when_silent(self):
        self.origin.route("/esi/x", "X")
        self.origin.route(
            "/page", 'a<esi:include src="http://evil.example/esi/x"/>c')
        self.assertBody("/page", b"ac")


class MarkupTestCase(EsiTestCase):
    """Pages whose right answer is (nearly) the origin's own bytes: a
    passthrough fallback or a module that did nothing would give them too,
    so each also shows that esid parsed the page."""

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")

    def assertParsed(self, page, expected, warnings=()):
        """GET /page (served as `page`): exactly `expected`, `$esi_status`
        processed, and esid's warnings about it exactly `warnings`."""
        self.origin.route("/page", page)
        self.assertBody("/page", expected)
        self.assertEqual(self.esi_status(1), "processed")
        self.assertWarned("/page", warnings)


class ConstructTest(MarkupTestCase):

    def test_remove_drops_its_content(self):
        self.origin.route("/page", "a<esi:remove>gone</esi:remove>c")
        self.assertBody("/page", b"ac")

    def test_esi_comment_block_is_unwrapped_and_processed(self):
        self.origin.route(
            "/page", 'a<!--esi <b><esi:include src="/esi/x"/></b>-->c')
        self.assertBody("/page", b"a <b>X</b>c")

    def test_esi_comment_tag_is_dropped(self):
        self.origin.route("/page", 'a<esi:comment text="note"/>c')
        self.assertBody("/page", b"ac")

    def test_vars_markup_is_stripped_and_its_variables_substituted(self):
        # test_language.py has the variables themselves
        self.start()
        self.origin.route("/page",
                          "a<esi:vars>v=$(HTTP_HOST) ok</esi:vars>c")
        self.assertBody("/page", ("av=%s okc" % self.host).encode())

    def test_unknown_esi_tag_is_passed_through_verbatim(self):
        page = 'a<esi:foo bar="1">x</esi:foo>c'
        self.assertParsed(page, page.encode(), [
            "ESI markup at byte 1: unknown ESI tag passed through",
            "ESI markup at byte 19: unknown ESI end tag passed through"])

    def test_ordinary_html_comment_is_untouched(self):
        page = 'a<!-- <esi:include src="/esi/x"/> -->c'
        self.assertParsed(page, page.encode())
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_cdata_is_untouched(self):
        page = 'a<![CDATA[<esi:include src="/esi/x"/><esi:remove>]]>c'
        self.assertParsed(page, page.encode())
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_page_without_esi_is_delivered_unchanged(self):
        page = "<html><body><p>1 < 2 & 3 > 2</p><esi</body></html>"
        self.assertParsed(page, page.encode())


class DepthTest(EsiTestCase):

    def test_self_include_is_refused_as_a_loop_at_once(self):
        # Not esi_max_depth (5 by default): the include names the page
        # itself, a loop, refused before it is fetched (test_limits.py
        # has longer loops).
        self.origin.route("/esi/self", 'A<esi:include src="/esi/self"/>B')
        self.assertBody("/esi/self", b"A" + ERROR_MARKER + b"B")
        self.assertEqual(self.origin.hits("/esi/self"), 1)
        self.assertEqual(self.esi_status(1), "processed")
        self.assertEqual(self.error_log().count(
            'esi: include "/esi/self" would include itself (a loop), '
            'refused'), 1, self.error_log())


class MaxDepthTwoTest(EsiTestCase):
    # esi_max_depth N allows N levels of includes below the page (Varnish's
    # max_esi_depth); the include that would open level N+1 is a failed
    # include, so it leaves the error marker.
    LOCATION = "esi_max_depth 2;"
    FRAGMENT_LOCATION = "esi_max_depth 2;"

    def test_include_beyond_max_depth_is_a_failed_include(self):
        self.origin.route("/page", '0<esi:include src="/esi/d1"/>0')
        self.origin.route("/esi/d1", '1<esi:include src="/esi/d2"/>1')
        self.origin.route("/esi/d2", '2<esi:include src="/esi/d3"/>2')
        self.origin.route("/esi/d3", "3")
        self.assertBody("/page", b"012" + ERROR_MARKER + b"210")
        self.assertEqual(self.origin.hits("/esi/d3"), 0)


class MalformedMarkupTest(MarkupTestCase):
    """Bad markup never costs the rest of the page; esid says what it did
    with it."""

    def test_unclosed_include_at_end_of_body_is_passed_as_text(self):
        page = '<p>kept</p><esi:include src="/esi/x"'
        self.assertParsed(page, page.encode(), [
            "ESI markup at byte 11: ESI tag not closed at end of stream"])
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_unclosed_remove_at_end_of_body_drops_the_rest(self):
        self.assertParsed("<p>kept</p><esi:remove>tail", b"<p>kept</p>", [
            "ESI markup at byte 11: <esi:remove> not closed at end of "
            "stream, rest dropped"])

    def test_include_without_src_is_dropped(self):
        # Varnish drops it (with a log line); there is nothing to include.
        self.assertParsed("<p>1</p><esi:include/><p>2</p>",
                          b"<p>1</p><p>2</p>", [
                              "ESI markup at byte 8: <esi:include> without "
                              "src dropped"])

    def test_nested_remove_drops_the_inner_content_and_keeps_the_rest(self):
        # The inner remove does not end the outer one: drop3 goes too.
        self.assertParsed(
            "<p>1</p><esi:remove>drop1<esi:remove>drop2</esi:remove>"
            "drop3</esi:remove><p>2</p>", b"<p>1</p><p>2</p>",
            ["ESI markup at byte 25: <esi:remove> inside <esi:remove>"])

    def test_mismatched_quotes_pass_the_tag_as_text(self):
        # the open quote runs into the next tag's '<'
        page = "<p>1</p><esi:include src=\"/esi/x'/><p>2</p>"
        self.assertParsed(page, page.encode(), [
            "ESI markup at byte 8: '<' inside an ESI tag, the tag taken as "
            "text"])
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_unquoted_attribute_is_read_up_to_the_space(self):
        self.assertParsed("<p>1</p><esi:include src=/esi/x /><p>2</p>",
                          b"<p>1</p>X<p>2</p>")
        self.assertEqual(self.origin.hits("/esi/x"), 1)

    def test_stray_closing_tags_are_dropped(self):
        self.assertParsed("<p>1</p></esi:remove></esi:include><p>2</p>",
                          b"<p>1</p><p>2</p>", [
                              "ESI markup at byte 8: </esi:remove> without "
                              "<esi:remove>",
                              "ESI markup at byte 21: </esi:include> without "
                              "<esi:include>"])


add_http2_variants(globals())

if __name__ == "__main__":
    unittest.main()
