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


class ConstructTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")

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
        self.origin.route("/page", page)
        self.assertBody("/page", page.encode())

    def test_ordinary_html_comment_is_untouched(self):
        page = 'a<!-- <esi:include src="/esi/x"/> -->c'
        self.origin.route("/page", page)
        self.assertBody("/page", page.encode())
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_cdata_is_untouched(self):
        page = 'a<![CDATA[<esi:include src="/esi/x"/><esi:remove>]]>c'
        self.origin.route("/page", page)
        self.assertBody("/page", page.encode())
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_page_without_esi_is_delivered_unchanged(self):
        page = "<html><body><p>1 < 2 & 3 > 2</p><esi</body></html>"
        self.origin.route("/page", page)
        self.assertBody("/page", page.encode())


class DepthTest(EsiTestCase):

    def test_self_include_stops_and_the_response_completes(self):
        # Default esi_max_depth 5: the page is cut off somewhere, not looped.
        self.origin.route("/esi/self", 'A<esi:include src="/esi/self"/>B')
        status, _, body = self.get("/esi/self")
        self.assertEqual(status, 200)
        opening = len(body) - len(body.lstrip(b"A"))
        closing = len(body) - len(body.rstrip(b"B"))
        self.assertEqual(opening, closing, body)
        self.assertIn(opening, range(1, 8), body)
        self.assertIn(body[opening:len(body) - closing], (b"", ERROR_MARKER))


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


class MalformedMarkupTest(EsiTestCase):
    """Bad markup never costs the rest of the page."""

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")

    def test_unclosed_include_at_end_of_body_keeps_what_came_before(self):
        self.origin.route("/page", '<p>kept</p><esi:include src="/esi/x"')
        status, _, body = self.get("/page")
        self.assertEqual(status, 200)
        self.assertTrue(body.startswith(b"<p>kept</p>"), body)

    def test_unclosed_remove_at_end_of_body_keeps_what_came_before(self):
        self.origin.route("/page", "<p>kept</p><esi:remove>tail")
        status, _, body = self.get("/page")
        self.assertEqual(status, 200)
        self.assertTrue(body.startswith(b"<p>kept</p>"), body)

    def test_include_without_src_is_dropped(self):
        # Varnish drops it (with a log line); there is nothing to include.
        self.origin.route("/page", "<p>1</p><esi:include/><p>2</p>")
        self.assertBody("/page", b"<p>1</p><p>2</p>")

    def test_nested_remove_drops_the_inner_content_and_keeps_the_rest(self):
        self.origin.route(
            "/page",
            "<p>1</p><esi:remove>drop1<esi:remove>drop2</esi:remove>"
            "drop3</esi:remove><p>2</p>")
        # The inner remove does not end the outer one: drop3 goes too.
        self.assertBody("/page", b"<p>1</p><p>2</p>")

    def test_mismatched_quotes_keep_the_rest_of_the_page(self):
        self.origin.route("/page",
                          "<p>1</p><esi:include src=\"/esi/x'/><p>2</p>")
        status, _, body = self.get("/page")
        self.assertEqual(status, 200)
        self.assertTrue(body.startswith(b"<p>1</p>"), body)
        self.assertTrue(body.endswith(b"<p>2</p>"), body)

    def test_unquoted_attribute_keeps_the_rest_of_the_page(self):
        self.origin.route("/page", "<p>1</p><esi:include src=/esi/x /><p>2</p>")
        status, _, body = self.get("/page")
        self.assertEqual(status, 200)
        self.assertTrue(body.startswith(b"<p>1</p>"), body)
        self.assertTrue(body.endswith(b"<p>2</p>"), body)

    def test_stray_closing_tag_keeps_the_rest_of_the_page(self):
        self.origin.route("/page", "<p>1</p></esi:remove></esi:include><p>2</p>")
        status, _, body = self.get("/page")
        self.assertEqual(status, 200)
        self.assertTrue(body.startswith(b"<p>1</p>"), body)
        self.assertTrue(body.endswith(b"<p>2</p>"), body)


add_http2_variants(globals())

if __name__ == "__main__":
    unittest.main()
