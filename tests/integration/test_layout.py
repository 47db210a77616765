"""The structures NGINX keeps private that the module reads (docs/architecture.md, "What
the module reads of NGINX's private structures"), in the builds of
tests/build-matrix.sh, which sets ESI_MATRIX_LAYOUT: "kept" for an nginx
built from its own source, where `nginx -t` passes; "moved" for one whose
gzip filter and proxy module have a member more at the start of their
location configuration and whose cache file header has one after its
version, where `nginx -t` fails naming each of them and this nginx's
version; "movedkey" for one whose proxy module has a member more before its
cache key, which only a same-location purge reads.  Skipped anywhere
else."""

import os
import re
import subprocess
import unittest

from harness import NGINX, EsiTestCase, free_port

LAYOUT = os.environ.get("ESI_MATRIX_LAYOUT")

# the member build-matrix.sh's move_layouts adds: an ngx_flag_t or ngx_uint_t
MOVED_BY = 8


class NginxTest(EsiTestCase):

    def nginx_t(self):
        self.port = free_port()
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(self.nginx_conf())
        log = os.path.join(self.tmp, "conftest.log")
        r = subprocess.run(
            [NGINX, "-t", "-p", self.tmp + "/", "-e", log, "-c", conf],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        return r.returncode, r.stderr.decode()

    def purge_in_each_module(self, proxy=""):
        """A same-location purge in a location of each upstream module
        with a cache key of its own (the proxy one with `proxy` more)."""
        self.HTTP = "".join(
            "%s_cache_path %s/%s keys_zone=%s:1m;\n" % (kind, self.tmp, kind,
                                                       kind)
            for kind in ("fastcgi", "uwsgi", "scgi"))
        self.LOCATIONS = "".join("""
        location /%s/ {
            %s_pass 127.0.0.1:9;
            %s_cache %s;
            %s_cache_key $uri;
            %s_cache_purge PURGE from 127.0.0.1;
        }
""" % ((kind,) * 6) for kind in ("fastcgi", "uwsgi", "scgi"))
        self.LOCATION = """
            proxy_cache_key $uri;
            proxy_cache_purge PURGE from 127.0.0.1;
""" + proxy

    def version(self):
        r = subprocess.run([NGINX, "-v"], capture_output=True, timeout=30)
        return re.search(r"nginx/[0-9.]+", r.stderr.decode()).group(0)


@unittest.skipUnless(LAYOUT == "kept", "run by tests/build-matrix.sh, "
                     "nginx with moved layouts")
class KeptLayoutTest(NginxTest):

    def test_nginx_t_passes_with_nginx_s_own_layouts(self):
        code, out = self.nginx_t()
        self.assertNotIn("ngx_http_esi_module:", out)
        self.assertEqual(code, 0, out)
        self.assertIn("test is successful", out)

    def test_each_modules_cache_key_is_found_for_a_same_location_purge(self):
        # ngx_http_esi_layout_cache_key(): the directives beside each
        # module's cache_key store where they do in NGINX 1.22 to 1.31
        self.purge_in_each_module()
        code, out = self.nginx_t()
        self.assertNotIn("ngx_http_esi_module:", out)
        self.assertEqual(code, 0, out)


@unittest.skipUnless(LAYOUT == "moved", "run by tests/build-matrix.sh, "
                     "nginx built from its own source")
class MovedLayoutTest(NginxTest):

    def setUp(self):
        super().setUp()
        self.code, self.out = self.nginx_t()
        self.assertNotEqual(self.code, 0, self.out)
        self.assertIn("test failed", self.out)
        self.nginx_version = self.version()

    def moved(self, module, directive):
        """The offsets the [emerg] line about DIRECTIVE of MODULE gives:
        where it is, where the module expected it."""
        m = re.search(
            r"\[emerg\] .*ngx_http_esi_module: %s's %s keeps \"%s\" at "
            r"offset (\d+) of its location configuration, not (\d+): "
            r"this module reads (.*?) as NGINX lays it out and cannot read "
            r"it here" % (re.escape(self.nginx_version), module, directive),
            self.out)
        self.assertIsNotNone(m, self.out)
        return int(m.group(1)), int(m.group(2)), m.group(3)

    def test_the_gzip_flag_moved_fails_nginx_t(self):
        at, expected, reads = self.moved("ngx_http_gzip_filter_module",
                                         "gzip")
        self.assertEqual((at, expected), (MOVED_BY, 0))
        self.assertEqual(reads, 'the "gzip" flag')

    def test_the_proxy_upstream_configuration_moved_fails_nginx_t(self):
        for directive, member in (("proxy_connect_timeout", "upstream"),
                                  ("proxy_cache_valid", "cache_zone")):
            at, expected, reads = self.moved("ngx_http_proxy_module",
                                             directive)
            self.assertEqual(at - expected, MOVED_BY)
            self.assertEqual(reads, "its ngx_http_upstream_conf_t (%s)"
                             % member)

    def test_the_cache_file_header_moved_fails_nginx_t(self):
        # include/esi/cache_file.h: where esid reads each member
        for member, at, size in (("header_start", 54, 2),
                                 ("body_start", 56, 2),
                                 ("vary_len", 187, 1),
                                 ("vary", 188, 128),
                                 ("variant", 316, 16)):
            self.assertIn(
                "ngx_http_esi_module: %s's cache file header "
                "(ngx_http_file_cache_header_t) keeps \"%s\" at offset %d "
                "(size %d), not at %d (size %d), where esid reads it: esid "
                "cannot index this nginx's caches"
                % (self.nginx_version, member, at + MOVED_BY, size, at, size),
                self.out)
        self.assertIn(
            "ngx_http_esi_module: %s's cache file header "
            "(ngx_http_file_cache_header_t) is %d bytes, not 336, where esid "
            "reads the KEY line" % (self.nginx_version, 336 + MOVED_BY),
            self.out)
        self.assertNotIn('keeps "version"', self.out)

    def test_what_did_not_move_is_not_named(self):
        # fastcgi, uwsgi and scgi are built from their own source
        lines = [line for line in self.out.splitlines()
                 if "ngx_http_esi_module:" in line]
        self.assertEqual(len(lines), 1 + 2 + 5 + 1, self.out)
        for module in ("fastcgi", "uwsgi", "scgi"):
            self.assertNotIn("ngx_http_%s_module" % module, self.out)



@unittest.skipUnless(LAYOUT == "movedkey", "run by tests/build-matrix.sh "
                     "against the nginx whose proxy cache key it moved")
class MovedKeyLayoutTest(NginxTest):
    """A member more before the proxy module's cache key, which only the
    same-location purge reads: nginx -t passes without one, and names the
    fix with one."""

    def test_nginx_t_passes_without_a_same_location_purge(self):
        code, out = self.nginx_t()
        self.assertNotIn("ngx_http_esi_module:", out)
        self.assertEqual(code, 0, out)

    def test_a_same_location_purge_of_proxy_cache_names_the_fix(self):
        self.purge_in_each_module()
        code, out = self.nginx_t()
        self.assertNotEqual(code, 0, out)
        self.assertRegex(
            out, r"\[emerg\] ngx_http_esi_module: %s's ngx_http_proxy_module "
            r'does not keep its cache key where "proxy_method" and '
            r'"proxy_http_version" prove it in NGINX 1.22 to 1.31, so the '
            r"same-location purge cannot read it here: set "
            r'"esi_cache_purge_key" to this location\'s cache key in '
            r"\S+nginx\.conf:\d+\n" % re.escape(self.version()))

    def test_esi_cache_purge_key_is_the_fix(self):
        self.purge_in_each_module(proxy="esi_cache_purge_key $uri;")
        code, out = self.nginx_t()
        self.assertNotIn("ngx_http_esi_module:", out)
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
