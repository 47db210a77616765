"""esi_include_access (issue #33, item 3b): NGINX runs no access phase for
subrequests, so an include reaches locations that allow/deny or auth_basic
keep from the client.  A page that reflects what a client sends lets that
client write `<esi:include src="/admin/x"/>` and read them.  With
`esi_include_access on` in the page's location each include faces the
access checks of the location it lands in, as the client would: refused,
it fails as an include fails (the error marker, alt=, onerror), with one
error line.  The client comes from 127.0.0.2, which `allow 127.0.0.1`
does not let in (the listener is on 127.0.0.1; loopback answers both)."""

import base64
import subprocess

from harness import ERROR_MARKER, OPENSSL, EsiTestCase

OUTSIDE = "127.0.0.2"
INSIDE = "127.0.0.1"

USER, PASSWORD = "editor", "s3cret"


def basic(user, password):
    token = base64.b64encode(("%s:%s" % (user, password)).encode())
    return {"Authorization": "Basic " + token.decode()}


GOOD = basic(USER, PASSWORD)
BAD = basic(USER, "wrong")

LOCATIONS = """
        location /admin/ {
            allow 127.0.0.1;
            deny all;
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }

        location /private/ {
            auth_basic "private";
            auth_basic_user_file @@TMP@@/htpasswd;
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }

        location /either/ {
            satisfy any;
            allow 127.0.0.1;
            deny all;
            auth_basic "either";
            auth_basic_user_file @@TMP@@/htpasswd;
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }

        location /internal/ {
            internal;
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }

        location /authreq/ {
            auth_request /auth;
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
        }

        location = /auth {
            internal;
            proxy_pass http://127.0.0.1:@@ORIGIN@@/auth-check;
        }

        # a public path whose file is never there: try_files redirects to
        # the protected location, inside the subrequest
        location /moved/ {
            root @@TMP@@;
            try_files $uri /admin/moved;
        }
"""

BOTH = 'a<esi:include src="/admin/x"/>b<esi:include src="/private/x"/>c'


def refused(uri, status, page="/page"):
    return ('esi: include "%s" of "%s" refused by the access checks of its '
            'location (%d), include failed' % (uri, page, status))


class IncludeAccessTestCase(EsiTestCase):
    LOCATIONS = LOCATIONS

    def setUp(self):
        super().setUp()
        with open(self.tmp + "/htpasswd", "w") as f:
            f.write("%s:%s\n" % (USER, subprocess.run(
                [OPENSSL, "passwd", "-apr1", PASSWORD], check=True,
                capture_output=True, text=True).stdout.strip()))
        for name in ("admin/x", "admin/moved", "private/x", "either/x",
                     "internal/x", "authreq/x", "esi/alt"):
            self.origin.route("/" + name, "[%s]" % name)
        self.origin.route("/auth-check", "")

    def page(self, markup, source=OUTSIDE, headers=None, path="/page"):
        """The page's body as the client at source gets it."""
        self.origin.route(path, markup)
        r = self.fetch(path, headers, source=source)
        self.assertTrue(r.complete, repr(r))
        self.assertEqual(r.status, 200, r.body)
        return r.body

    def error_lines(self, text):
        return [l for l in self.error_log().splitlines() if text in l]


class OffTest(IncludeAccessTestCase):
    """The hole, as it is by default: the outside client reads both."""

    def test_an_outside_client_reads_what_is_denied_to_it(self):
        self.start()
        self.assertEqual(self.fetch("/admin/x", source=OUTSIDE).status, 403)
        self.assertEqual(self.fetch("/private/x", source=OUTSIDE).status,
                         401)
        self.assertEqual(self.page(BOTH), b"a[admin/x]b[private/x]c")


class OnTest(IncludeAccessTestCase):
    LOCATION = "esi_include_access on;"

    def test_an_outside_client_gets_the_include_error(self):
        self.assertEqual(self.page(BOTH),
                         b"a" + ERROR_MARKER + b"b" + ERROR_MARKER + b"c")
        self.assertEqual(self.origin.hits("/admin/x"), 0)
        self.assertEqual(self.origin.hits("/private/x"), 0)
        self.assertEqual(len(self.error_lines(refused("/admin/x", 403))), 1)
        self.assertEqual(len(self.error_lines(refused("/private/x", 401))),
                         1)

    def test_a_refused_include_fails_to_alt_and_onerror(self):
        self.assertEqual(self.page(
            'a<esi:include src="/admin/x" alt="/esi/alt"/>b'
            '<esi:include src="/private/x" onerror="continue"/>c'),
            b"a[esi/alt]bc")
        self.assertEqual(self.origin.hits("/admin/x"), 0)
        self.assertEqual(self.origin.hits("/private/x"), 0)

    def test_a_refused_include_fails_its_try(self):
        self.assertEqual(self.page(
            '<esi:try><esi:attempt>a<esi:include src="/admin/x"/>'
            '</esi:attempt><esi:except>E</esi:except></esi:try>'), b"E")

    def test_the_inside_client_with_the_password_gets_both(self):
        self.assertEqual(self.page(BOTH, INSIDE, GOOD),
                         b"a[admin/x]b[private/x]c")
        self.assertEqual(self.error_lines("refused by the access checks"),
                         [])

    def test_a_wrong_password_is_refused(self):
        self.assertEqual(self.page(BOTH, INSIDE, BAD),
                         b"a[admin/x]b" + ERROR_MARKER + b"c")
        self.assertEqual(len(self.error_lines(refused("/private/x", 401))),
                         1)

    def test_satisfy_any_lets_either_check_pass(self):
        markup = 'a<esi:include src="/either/x"/>c'
        self.assertEqual(self.page(markup, INSIDE), b"a[either/x]c")
        self.assertEqual(self.page(markup, OUTSIDE, GOOD), b"a[either/x]c")
        self.assertEqual(self.page(markup, OUTSIDE),
                         b"a" + ERROR_MARKER + b"c")
        # both refused: the authentication's 401, as NGINX prefers it
        self.assertEqual(len(self.error_lines(refused("/either/x", 401))), 1)
        self.assertEqual(self.origin.hits("/either/x"), 2)

    def test_an_internal_location_stays_includable(self):
        self.start()
        self.assertEqual(self.fetch("/internal/x", source=OUTSIDE).status,
                         404)
        self.assertEqual(self.page('a<esi:include src="/internal/x"/>c'),
                         b"a[internal/x]c")

    def test_auth_request_is_refused_with_its_own_line(self):
        self.assertEqual(self.page('a<esi:include src="/authreq/x"/>c'),
                         b"a" + ERROR_MARKER + b"c")
        self.assertEqual(self.origin.hits("/authreq/x"), 0)
        lines = self.error_lines(
            'esi: include "/authreq/x" of "/page" refused: an access check '
            'of its location waits for a subrequest (auth_request)')
        self.assertEqual(len(lines), 1, self.error_log())

    def test_a_redirect_inside_the_include_is_checked_again(self):
        self.assertEqual(self.page('a<esi:include src="/moved/x"/>c'),
                         b"a" + ERROR_MARKER + b"c")
        self.assertEqual(self.origin.hits("/admin/moved"), 0)
        self.assertEqual(
            len(self.error_lines(refused("/admin/moved", 403))), 1)

    def test_a_fragment_page_checks_its_includes_too(self):
        # location /esi/ has no esi_include_access of its own
        self.origin.route("/esi/outer", '(<esi:include src="/admin/x"/>)')
        self.assertEqual(self.page('a<esi:include src="/esi/outer"/>c'),
                         b"a(" + ERROR_MARKER + b")c")
        self.assertEqual(self.origin.hits("/admin/x"), 0)
        self.assertEqual(len(self.error_lines(
            refused("/admin/x", 403, "/esi/outer"))), 1)


class OffInThePagesLocationTest(IncludeAccessTestCase):
    """The page's location decides: on elsewhere changes nothing here."""
    FRAGMENT_LOCATION = "esi_include_access on;"

    def test_the_page_without_it_reads_both(self):
        self.assertEqual(self.page(BOTH), b"a[admin/x]b[private/x]c")


if __name__ == "__main__":
    import unittest
    unittest.main()
