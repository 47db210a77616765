"""The ESI 1.0 language through real nginx + esid (issue #9): variables,
choose/when/otherwise and try/attempt/except, one behaviour per test, exact
bytes.  Variables describe the client's request, which the worker sends
esid with each stream (proto/README.md, "Variables and try"); cookies only
as esi_cookies allows.

Default configuration (harness.NGINX_CONF): `location /` proxies the origin
with proxy_cache and `esi on`; `location /esi/` proxies it uncached with
`esi on`.
"""

import http.client
import socket
import threading
import unittest

from harness import (ERROR_MARKER, EsiTestCase, add_http2_variants,
                     http1_only, poll)
from test_plan import PlanTestCase

VARS = '<esi:vars>[%s]</esi:vars>'

CHOOSE = ('<esi:choose>'
          '<esi:when test="$(HTTP_COOKIE{group})==\'gold\'">G</esi:when>'
          '<esi:when test="$(HTTP_COOKIE{group})==\'silver\'">S</esi:when>'
          '<esi:otherwise>O</esi:otherwise>'
          '</esi:choose>')


def attempt(body, except_part="E"):
    return ('<esi:try><esi:attempt>%s</esi:attempt>'
            '<esi:except>%s</esi:except></esi:try>' % (body, except_part))


def include(src, extra=""):
    return '<esi:include src="%s"%s/>' % (src, extra)


class LanguageTestCase(EsiTestCase):
    LOCATION = "esi_cookies user group;"
    LOCATIONS = """
        location /dead/ {
            proxy_pass http://127.0.0.1:1;
            esi on;
        }
"""

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/x", "X")
        self.origin.route("/esi/y", "Y")
        self.origin.route("/esi/missing", "gone", status=404)
        # /esi/echo... answers with the request target it received.
        self.origin.prefix("/esi/echo", lambda target: "[%s]" % target)

    def render(self, markup, headers=None, path="/page"):
        """The body of `markup` served at `path`, as a client gets it."""
        self.origin.route(path, markup)
        status, _, body = self.get(path, headers)
        self.assertEqual(status, 200)
        return body

    def vars(self, reference, headers=None, path="/page"):
        return self.render(VARS % reference, headers, path)


class CookieTest(LanguageTestCase):

    def test_a_named_cookie_is_substituted(self):
        self.assertEqual(self.vars("$(HTTP_COOKIE{user})",
                                   {"Cookie": "user=ann; secret=s3"}),
                         b"[ann]")

    def test_a_cookie_esi_cookies_does_not_name_is_empty(self):
        self.assertEqual(self.vars("$(HTTP_COOKIE{secret})",
                                   {"Cookie": "user=ann; secret=s3"}),
                         b"[]")

    def test_cookies_are_read_as_browsers_send_them(self):
        self.assertEqual(
            self.vars("$(HTTP_COOKIE{user})/$(HTTP_COOKIE{group})",
                      {"Cookie": "secret=s3;user=ann ;  group=gold"}),
            b"[ann/gold]")

    @http1_only
    def test_cookies_of_several_headers_are_read_together(self):
        # as HTTP/2 clients send them: one Cookie header per cookie
        self.origin.route("/page", VARS % "$(HTTP_COOKIE{user})/"
                          "$(HTTP_COOKIE{group})")
        self.start()
        with socket.create_connection(("127.0.0.1", self.port)) as conn:
            conn.sendall(b"GET /page HTTP/1.1\r\nHost: x\r\n"
                         b"Cookie: user=ann\r\nCookie: group=gold\r\n"
                         b"Connection: close\r\n\r\n")
            response = http.client.HTTPResponse(conn)
            response.begin()
            self.assertEqual(response.read(), b"[ann/gold]")

    def test_without_a_cookie_header_the_default_applies(self):
        self.assertEqual(self.vars("$(HTTP_COOKIE{user}|'new user')"),
                         b"[new user]")


class NoCookiesTest(LanguageTestCase):
    LOCATION = ""

    def test_no_cookie_is_readable_by_default(self):
        self.assertEqual(self.vars("$(HTTP_COOKIE{user}|none)",
                                   {"Cookie": "user=ann"}),
                         b"[none]")


class AllCookiesTest(LanguageTestCase):
    LOCATION = "esi_cookies *;"

    def test_star_allows_every_cookie(self):
        self.assertEqual(
            self.vars("$(HTTP_COOKIE{user})/$(HTTP_COOKIE{secret})",
                      {"Cookie": "user=ann; secret=s3"}),
            b"[ann/s3]")


class RequestVariablesTest(LanguageTestCase):

    def test_query_string_parameters_are_decoded(self):
        self.assertEqual(self.vars("$(QUERY_STRING{q})",
                                   path="/page?q=a%20b+c&x=1"),
                         b"[a b c]")

    def test_a_query_parameter_in_src_is_percent_escaped(self):
        self.assertEqual(
            self.render(include("/esi/echo?id=$(QUERY_STRING{id})"),
                        path="/page?id=7%268"),
            b"[/esi/echo?id=7%268]")

    def test_accept_language_is_a_list_of_ranges(self):
        reference = ("$(HTTP_ACCEPT_LANGUAGE{fr})"
                     "$(HTTP_ACCEPT_LANGUAGE{de})")
        self.assertEqual(self.vars(reference, {
            "Accept-Language": "en-GB, fr;q=0.8, de;q=0"}),
            b"[truefalse]")

    def test_without_accept_language_no_language_is_accepted(self):
        self.assertEqual(self.vars("$(HTTP_ACCEPT_LANGUAGE{en})"),
                         b"[false]")

    def test_user_agents_are_classified(self):
        reference = ("$(HTTP_USER_AGENT{browser}) $(HTTP_USER_AGENT{os}) "
                     "$(HTTP_USER_AGENT{version})")
        cases = [
            ("Mozilla/4.0 (compatible; MSIE 5.5; Windows NT 5.0)",
             b"[MSIE WIN 5.5]"),
            ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) "
             "AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1",
             b"[MOZILLA MAC 5.0]"),
            ("Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 "
             "Firefox/121.0", b"[MOZILLA UNIX 5.0]"),
            ("curl/8.1.2", b"[OTHER OTHER 8.1.2]"),
        ]
        for agent, expected in cases:
            self.assertEqual(self.vars(reference, {"User-Agent": agent}),
                             expected, agent)

    def test_host_and_referer_are_the_clients(self):
        self.start()
        self.assertEqual(
            self.vars("$(HTTP_HOST) $(HTTP_REFERER)",
                      {"Referer": "http://example.com/from"}),
            ("[%s http://example.com/from]" % self.host).encode())

    def test_a_fragment_page_reads_the_clients_request(self):
        self.origin.route("/esi/frag", VARS % "$(QUERY_STRING{id})")
        self.assertEqual(self.render(include("/esi/frag?id=inner"),
                                     path="/page?id=outer"),
                         b"[outer]")


class HostileValueTest(LanguageTestCase):
    """A value is text wherever it lands: never markup, never a header."""
    SERVER = "large_client_header_buffers 4 32k;"

    def test_markup_in_a_cookie_is_escaped_not_parsed(self):
        self.assertEqual(
            self.vars("$(HTTP_COOKIE{user})",
                      {"Cookie": 'user="><esi:include src="/esi/x"/>'
                                 '</esi:vars>'}),
            b'[&quot;&gt;&lt;esi:include src=&quot;/esi/x&quot;/&gt;'
            b'&lt;/esi:vars&gt;]')
        self.assertEqual(self.origin.hits("/esi/x"), 0)

    def test_a_reference_in_a_value_is_not_evaluated(self):
        self.assertEqual(self.vars("$(HTTP_COOKIE{user})",
                                   {"Cookie": "user=$(HTTP_HOST)"}),
                         b"[$(HTTP_HOST)]")

    def test_crlf_in_a_query_never_becomes_a_header_of_the_include(self):
        body = self.render(include("/esi/echo?q=$(QUERY_STRING{q})"),
                           path="/page?q=a%0D%0AX-Injected:%201")
        self.assertEqual(body, b"[/esi/echo?q=a%0D%0AX-Injected%3A%201]")
        for method, target, headers in self.origin.requests():
            self.assertNotIn("x-injected", [k.lower() for k in headers])
            self.assertNotIn("\r", target)
            self.assertNotIn("\n", target)

    def test_a_cookie_in_src_reaches_the_origin_percent_escaped(self):
        body = self.render(include("/esi/echo?u=$(HTTP_COOKIE{user})"),
                           {"Cookie": 'user=a"b<c>d e'})
        self.assertEqual(body, b"[/esi/echo?u=a%22b%3Cc%3Ed%20e]")

    def test_a_cookie_over_8k_is_absent(self):
        self.assertEqual(
            self.vars("$(HTTP_COOKIE{user}|absent)",
                      {"Cookie": "user=" + "x" * 9000}),
            b"[absent]")

    def test_a_user_agent_over_8k_is_absent(self):
        self.assertEqual(
            self.vars("$(HTTP_USER_AGENT{browser})",
                      {"User-Agent": "MSIE " + "9" * 9000}),
            b"[OTHER]")


class ChooseTest(LanguageTestCase):

    def test_the_first_true_when_is_chosen(self):
        for cookie, expected in (("group=gold", b"aGb"),
                                 ("group=silver", b"aSb"),
                                 ("group=bronze", b"aOb")):
            self.assertEqual(self.render("a" + CHOOSE + "b",
                                         {"Cookie": cookie}),
                             expected, cookie)

    def test_without_otherwise_nothing_is_chosen(self):
        markup = ('a<esi:choose><esi:when test="1==2">no</esi:when>'
                  '</esi:choose>b')
        self.assertEqual(self.render(markup), b"ab")

    def test_only_the_chosen_branch_includes(self):
        markup = ('<esi:choose>'
                  '<esi:when test="$(HTTP_COOKIE{group})==\'gold\'">'
                  + include("/esi/x") + '</esi:when>'
                  '<esi:otherwise>' + include("/esi/y") + '</esi:otherwise>'
                  '</esi:choose>')
        self.assertEqual(self.render(markup, {"Cookie": "group=gold"}), b"X")
        self.assertEqual(self.origin.hits("/esi/y"), 0)

    def test_choose_nests(self):
        markup = ('<esi:choose>'
                  '<esi:when test="$(HTTP_COOKIE{group})==\'gold\'">'
                  '<esi:choose>'
                  '<esi:when test="$(HTTP_ACCEPT_LANGUAGE{fr})">or</esi:when>'
                  '<esi:otherwise>gold</esi:otherwise>'
                  '</esi:choose>'
                  '</esi:when>'
                  '<esi:otherwise>other</esi:otherwise>'
                  '</esi:choose>')
        for headers, expected in (
                ({"Cookie": "group=gold", "Accept-Language": "fr"}, b"or"),
                ({"Cookie": "group=gold"}, b"gold"),
                ({"Accept-Language": "fr"}, b"other")):
            self.assertEqual(self.render(markup, headers), expected, headers)


class TryTest(LanguageTestCase):

    def test_a_succeeding_attempt_is_kept_and_except_never_runs(self):
        body = self.render("a" + attempt("1" + include("/esi/x") + "2",
                                         include("/esi/y")) + "b")
        self.assertEqual(body, b"a1X2b")
        self.assertEqual(self.origin.hits("/esi/y"), 0)

    def test_a_404_include_drops_the_attempt_for_except(self):
        self.assertEqual(
            self.render("a" + attempt("1" + include("/esi/x")
                                      + include("/esi/missing") + "2",
                                      "E" + include("/esi/y")) + "b"),
            b"aEYb")

    def test_a_dead_upstream_drops_the_attempt(self):
        self.assertEqual(
            self.render("a" + attempt(include("/dead/frag")) + "b"),
            b"aEb")

    def test_an_include_whose_alt_fails_too_drops_the_attempt(self):
        self.assertEqual(
            self.render("a" + attempt(include(
                "/esi/missing", ' alt="/dead/alt"')) + "b"),
            b"aEb")

    def test_an_include_saved_by_its_alt_keeps_the_attempt(self):
        self.assertEqual(
            self.render("a" + attempt(include(
                "/esi/missing", ' alt="/esi/x"')) + "b"),
            b"aXb")

    def test_onerror_continue_does_not_fail_the_attempt(self):
        self.assertEqual(
            self.render("a" + attempt("1" + include(
                "/esi/missing", ' onerror="continue"') + "2") + "b"),
            b"a12b")

    def test_many_includes_of_an_attempt_keep_their_order(self):
        for n in range(6):
            self.origin.route("/esi/n%d" % n, "<%d>" % n)
        self.assertEqual(
            self.render(attempt("".join(include("/esi/n%d" % n) + "."
                                        for n in range(6)))),
            b"<0>.<1>.<2>.<3>.<4>.<5>.")

    def test_a_large_fragment_is_held_whole(self):
        big = "".join("line %06d\n" % i for i in range(20000))
        self.origin.route("/esi/big", big)
        self.assertEqual(self.render("a" + attempt(include("/esi/big"))
                                     + "b"),
                         b"a" + big.encode() + b"b")

    def test_an_attempt_longer_than_the_bodys_buffers_goes_out_whole(self):
        # 400 KB of the page's own text held by the attempt: held as the
        # body's buffers, they would stop the body being read
        text = "<p>%s</p>" % ("y" * 200000)
        body = "a" + attempt(text + include("/esi/x") + text) + "b"
        expected = ("a" + text + "X" + text + "b").encode()
        self.origin.route("/page", body)
        for status in ("MISS", "HIT"):
            _, headers, got = self.get("/page")
            self.assertEqual(headers.get("X-Cache-Status"), status)
            self.assertEqual(got, expected)

    def test_a_failing_nested_attempt_leaves_the_outer_one_whole(self):
        inner = attempt("i" + include("/esi/missing"), "I")
        self.assertEqual(
            self.render("a" + attempt("1" + inner + include("/esi/x")
                                      + "2") + "b"),
            b"a1IX2b")

    def test_a_failure_after_a_nested_try_drops_the_outer_attempt(self):
        inner = attempt("i" + include("/esi/x"), "I")
        self.assertEqual(
            self.render("a" + attempt("1" + inner + include("/esi/missing"),
                                      "E" + attempt(include("/esi/y")))
                        + "b"),
            b"aEYb")

    def test_a_try_inside_an_included_fragment_works_there(self):
        self.origin.route("/esi/frag",
                          "<" + attempt(include("/esi/missing")) + ">")
        self.assertEqual(self.render("a" + include("/esi/frag") + "b"),
                         b"a<E>b")

    def test_an_esi_fragment_in_an_attempt_is_held_after_its_own_processing(
            self):
        self.origin.route("/esi/frag", "(" + include("/esi/x") + ")")
        self.assertEqual(
            self.render("a" + attempt("[" + include("/esi/frag") + "]")
                        + "b"),
            b"a[(X)]b")

    def test_a_fragments_own_failed_include_does_not_fail_the_attempt(self):
        self.origin.route("/esi/frag", "(" + include("/esi/missing") + ")")
        self.assertEqual(
            self.render("a" + attempt(include("/esi/frag")) + "b"),
            b"a(" + ERROR_MARKER + b")b")


    def test_a_try_in_a_fragment_held_by_an_attempt_decides_alone(self):
        self.origin.route("/esi/frag",
                          "<" + attempt(include("/esi/missing"), "F") + ">")
        self.assertEqual(
            self.render("a" + attempt(include("/esi/frag")) + "b"),
            b"a<F>b")

    def test_an_attempt_behind_a_slow_concurrent_include_keeps_order(self):
        # /esi/slow is issued at once and holds the connection's output;
        # the attempt's includes run and complete behind it
        released = self.origin.hold("/esi/slow")
        self.origin.route("/esi/slow", "S")
        self.origin.route("/page", "<" + include("/esi/slow")
                          + attempt(include("/esi/x") + include("/esi/y"))
                          + ">")
        self.start()
        result = []
        client = threading.Thread(
            target=lambda: result.append(self.fetch("/page")))
        client.start()
        try:
            self.assertTrue(self.origin.wait_for_hits("/esi/y"))
        finally:
            released.set()
            client.join(60)
        self.assertEqual(result[0].body, b"<SXY>")

    def test_tries_nested_past_the_limit_never_break_the_connection(self):
        markup = "a" + "<esi:try><esi:attempt>" * 70 + include("/esi/x") + \
            "</esi:attempt><esi:except>E</esi:except></esi:try>" * 70 + "b"
        body = self.render(markup)
        self.assertTrue(body.startswith(b"a") and body.endswith(b"b"), body)
        self.assertEqual(self.esi_status(1), "processed")
        self.assertNotIn("dropping the connection", self.error_log())


class SilentTryTest(LanguageTestCase):
    LOCATION = "esi_silent_errors on;"

    def test_silent_errors_do_not_hide_a_failure_from_the_try(self):
        self.assertEqual(
            self.render("a" + attempt("1" + include("/esi/missing")) + "b"),
            b"aEb")


class TryPageSizeTest(LanguageTestCase):
    LOCATION = "esi_max_page_size 4k;"

    def test_includes_held_past_esi_max_page_size_fail_the_attempt(self):
        self.origin.route("/esi/big", "x" * 5000)
        self.assertEqual(
            self.render("a" + attempt(include("/esi/big")) + "b"),
            b"aEb")
        self.assertIn("exceed esi_max_page_size", self.error_log())

    def test_all_attempts_of_a_page_share_esi_max_page_size(self):
        # each fits, together they do not: the copies live as long as the
        # request
        self.origin.route("/esi/half", "x" * 3000)
        self.assertEqual(
            self.render(attempt(include("/esi/half"))
                        + attempt(include("/esi/half"))),
            b"x" * 3000 + b"E")


class TryFaultCase(LanguageTestCase):
    """Nothing leaks or hangs when an attempt is cut short."""

    # the tail keeps the stream open (its buffers are held behind the
    # include) until esid is gone
    PAGE = ("a" + attempt("1" + include("/esi/hold") + "2") + "b"
            + "<p>tail</p>" * 20000)

    def setUp(self):
        super().setUp()
        self.released = self.origin.hold("/esi/hold")
        self.origin.route("/esi/hold", "H")
        self.origin.route("/page", self.PAGE)
        self.start()

    def fetch_while_esid_dies(self, logged):
        """GET /page, killing esid while the attempt waits for its include;
        the include answers once error.log shows `logged`."""
        result = []
        client = threading.Thread(
            target=lambda: result.append(self.fetch("/page")))
        client.start()
        try:
            self.assertTrue(self.origin.wait_for_hits("/esi/hold"))
            self.esid.kill()
            self.assertTrue(poll(lambda: logged in self.error_log(),
                                 bound=10.0))
        finally:
            self.released.set()
            client.join(60)
        self.assertFalse(client.is_alive(), "request hung")
        return result[0]


class TryFaultTest(TryFaultCase):

    def test_esid_dying_mid_attempt_sends_what_was_held_then_the_rest(self):
        r = self.fetch_while_esid_dies("processing failed")
        # "1" was held when esid went: it goes out, then the page's bytes
        # from there on as they are; the held fragment's answer is dropped
        self.assertEqual(r.body, b"a1" + self.PAGE.split("1", 1)[1].encode())
        self.assertEqual(self.esi_status(1), "passthrough")

    @http1_only
    def test_a_client_gone_mid_attempt_leaves_the_worker_serving(self):
        conn = socket.create_connection(("127.0.0.1", self.port))
        conn.sendall(b"GET /page HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(self.origin.wait_for_hits("/esi/hold"))
        conn.close()
        self.released.set()
        self.origin.route("/other", "a" + attempt(include("/esi/x")) + "b")
        self.assertEqual(self.get("/other")[2], b"aXb")
        self.assertTrue(poll(lambda: len(self.access_log(2)) == 2))


class TryFaultAbortTest(TryFaultCase):
    LOCATION = "esi_fallback abort;"

    def test_esid_dying_mid_attempt_cuts_the_response_off(self):
        r = self.fetch_while_esid_dies("request aborted")
        self.assertFalse(r.complete, r)
        self.assertEqual(self.esi_status(1), "aborted")


class PlannedLanguageTest(PlanTestCase):
    """A cached page's plan memoises its structure; each request still
    gets its own variables, choice and try outcome."""
    LOCATION = "esi_plan plans;\n            esi_cookies user group;"

    def test_each_request_gets_its_own_output_from_one_plan(self):
        self.origin.route("/esi/missing", "gone", status=404)
        markup = ("<p>" + VARS % "$(HTTP_COOKIE{user}|anon)" + CHOOSE
                  + attempt("t" + include("/esi/a"), "e") + "</p>"
                  + "<p>" + "filler " * 50 + "</p>")
        filler = "<p>" + "filler " * 50 + "</p>"
        self.origin.route("/p", markup)
        self.hit("/p", "<p>[anon]OtA</p>" + filler, "MISS")
        self.hit("/p", "<p>[anon]OtA</p>" + filler)      # plan recorded
        before = self.counters()[0]
        cases = (({"Cookie": "user=ann; group=gold"}, "<p>[ann]GtA</p>"),
                 ({"Cookie": "user=bob; group=silver"}, "<p>[bob]StA</p>"),
                 ({}, "<p>[anon]OtA</p>"))
        for headers, expected in cases:
            status, hdrs, body = self.get("/p", headers)
            self.assertEqual(hdrs.get("X-Cache-Status"), "HIT")
            self.assertEqual(body, (expected + filler).encode(), headers)
        self.assertEqual(self.counters()[0], before + len(cases))

    def test_a_vars_block_that_differs_inside_drops_the_plan_at_its_start(
            self):
        # the block goes out as one literal made by esid: its check holds
        # all of it, text between the values included
        block = ("<esi:vars><ul><li>$(HTTP_COOKIE{user}|anon)</li>"
                 "<li>$(HTTP_COOKIE{group}|none)</li></ul></esi:vars>")
        filler = "<p>" + "filler " * 50 + "</p>"
        self.origin.route("/p", filler + block + filler)
        cookie = {"Cookie": "user=<ann>; group=a&b"}
        out = "<ul><li>&lt;ann&gt;</li><li>a&amp;b</li></ul>"
        self.hit("/p", filler + "<ul><li>anon</li><li>none</li></ul>" + filler,
                 "MISS")
        self.hit("/p", filler + "<ul><li>anon</li><li>none</li></ul>" + filler)
        status, _, body = self.get("/p", cookie)
        self.assertEqual(body, (filler + out + filler).encode())
        self.assertEqual(self.counters()[0], 1)
        self.rewrite_cached_body("</li><li>", "</li><lo>")
        status, _, body = self.get("/p", cookie)
        self.assertEqual(body, (filler + out.replace("</li><li>", "</li><lo>")
                                + filler).encode())
        self.assertTrue(poll(lambda: "plan dropped at byte %d: a construct "
                             "differs" % len(filler) in self.error_log()))

    def test_a_plan_that_stops_matching_inside_a_try_drops_before_it(self):
        # the include inside the attempt differs: the worker checks the try
        # whole before running any of it, so the plan is dropped where the
        # try's gap starts and esid parses the try
        head = "a" + "<esi:try><esi:attempt>" + "x" * 300
        tail = ('<esi:include src="/esi/a"/></esi:attempt>'
                '<esi:except>E</esi:except></esi:try>b')
        self.origin.route("/p", head + tail)
        self.hit("/p", "a" + "x" * 300 + "Ab", "MISS")
        self.hit("/p", "a" + "x" * 300 + "Ab")
        self.rewrite_cached_body('src="/esi/a"', 'src="/esi/b"')
        self.hit("/p", "a" + "x" * 300 + "Bb")
        self.assertTrue(poll(lambda: "plan dropped at byte 1: a construct "
                             "differs" in self.error_log()))
        self.assertEqual(self.esi_status(3), "processed")

    def test_a_planned_try_still_fails_over_per_request(self):
        # the fragment's fate is decided per delivery, not memoised
        self.origin.route("/esi/flaky", "ok")
        self.origin.route("/p", "a" + attempt(include("/esi/flaky")) + "b")
        self.hit("/p", "aokb", "MISS")
        self.hit("/p", "aokb")
        self.origin.route("/esi/flaky", "down", status=503)
        self.hit("/p", "aEb")
        self.assertEqual(self.counters()[0], 1)


add_http2_variants(globals())

if __name__ == "__main__":
    unittest.main()
