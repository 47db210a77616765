"""A full (and a read-only) cache file system (issue #23, item 4).

The cache directory is a tmpfs of 256 KiB mounted by the test (root
only, as CI runs), filled to the last byte by a file of the test's own.
NGINX then cannot store a page (it logs its own [alert] for the write
that failed): the page is still served, ESI processed from the upstream's
response, and a purge counts what it removed, which is nothing, since
nothing was stored.  Pages stored before the disk filled are purged with
the right counts (unlink and the soft purge's pwrite into a header need
no space).  Once the file is removed the next request stores the page and
the one after is a HIT.  On a file system remounted read-only, a soft
purge cannot mark a file stale: it answers 500 `failed=1` and says why,
rather than the 404 of a key not cached; a purge that cannot unlink has
still taken the object out of the keys_zone (no longer served) and counts
it.
"""

import errno
import os
import subprocess
import unittest

from harness import EsiTestCase

# The harness's "location /" caches in zone "pages" under @@TMP@@/cache.
PURGE_LOCATION = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
"""
PAGE = 'a<esi:include src="/esi/x"/>c'
ASSEMBLED = b"aXc"
NO_SPACE = "(28: No space left on device)"


class FullDiskTest(EsiTestCase):
    LOCATION = PURGE_LOCATION
    ESID_ARGS = ("--log-level", "info")
    # NGINX's own, for the cache file it could not write.
    EXPECTED_ALERTS = (r'\[alert\] .* write\(\) "[^"]*/cache/[0-9a-f]{32}'
                       r'\.[0-9]+" failed \(28: No space left on device\)',)

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        self.cache = os.path.join(self.tmp, "cache")
        os.mkdir(self.cache)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700",
                        "tmpfs", self.cache], check=True)
        # Lazily: nginx, stopped after this runs, still has it open.
        self.addCleanup(subprocess.run, ["umount", "-l", self.cache],
                        check=True)
        self.filler = os.path.join(self.cache, "filler")
        self.origin.route("/esi/x", "X")
        for path in ("/page", "/kept", "/soft", "/tagged"):
            self.origin.route(path, PAGE, headers=[("xkey", "t")]
                              if path == "/tagged" else [])

    def fill(self):
        """Writes the filler until the file system has no byte left."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for block in (b"x" * 4096, b"x"):
                try:
                    while True:
                        os.write(fd, block)
                except OSError as e:
                    self.assertEqual(e.errno, errno.ENOSPC, e)
        finally:
            os.close(fd)

    def cache_files(self):
        return sorted(n for n in os.listdir(self.cache) if len(n) == 32)

    def assertServed(self, path, cache_status):
        status, headers, body = self.get(path)
        self.assertEqual((status, body), (200, ASSEMBLED), path)
        self.assertEqual(headers.get("X-Cache-Status"), cache_status, path)

    def purge(self, path, headers=None):
        r = self.fetch(path, headers, method="PURGE")
        self.assertTrue(r.complete, r)
        return r

    def test_pages_are_served_and_purges_count_while_the_disk_is_full(self):
        for path in ("/kept", "/soft", "/tagged"):
            self.assertServed(path, "MISS")
        self.assertEqual(len(self.cache_files()), 3)
        self.fill()

        # Nothing can be stored; every request is a processed MISS.
        self.assertServed("/page", "MISS")
        self.assertServed("/page", "MISS")
        self.assertEqual(self.origin.hits("/page"), 2)
        self.assertIn(NO_SPACE, self.error_log())
        self.assertEqual(len(self.cache_files()), 3)
        # esid processed both: they were its streams, not passed through.
        self.assertEqual(self.esi_status(4), "processed")
        self.assertEqual(self.esi_status(5), "processed")

        # What was never stored is not counted; what was, is.
        r = self.purge("/page")
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (404, "exact; count=0"))
        r = self.purge("/kept")
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "exact; count=1"))
        r = self.purge("/soft", {"Fastly-Soft-Purge": "1"})
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "exact; count=1; soft"))
        r = self.purge("/", {"xkey": "t"})
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "tag; count=1"))
        self.assertEqual(len(self.cache_files()), 1)   # /soft, stale
        self.assertServed("/soft", "EXPIRED")

        # Space again: the next request stores the page.
        os.unlink(self.filler)
        self.assertServed("/page", "MISS")
        self.assertServed("/page", "HIT")
        r = self.purge("/page")
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "exact; count=1"))

    def test_a_soft_purge_that_cannot_mark_a_file_says_it_failed(self):
        self.assertServed("/soft", "MISS")
        self.assertServed("/soft", "HIT")
        self.assertServed("/kept", "MISS")
        subprocess.run(["mount", "-o", "remount,ro", self.cache], check=True)
        self.addCleanup(subprocess.run, ["mount", "-o", "remount,rw",
                                         self.cache])
        r = self.purge("/soft", {"Fastly-Soft-Purge": "1"})
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (500, "exact; count=0; failed=1; soft"), r.body)
        self.assertIn(b"Purge failed", r.body)
        self.assertIn(b"1 file(s) could not be marked stale (see the error "
                      b"log)", r.body)
        self.assertIn("(30: Read-only file system)", self.error_log())
        # Not marked: still a HIT.
        self.assertServed("/soft", "HIT")
        # A purge that cannot unlink has still taken the object out of
        # the keys_zone: it counts, and the next request is a MISS.
        r = self.purge("/kept")
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "exact; count=1"))
        self.assertServed("/kept", "MISS")

        # Writable again, the same purge marks it.
        subprocess.run(["mount", "-o", "remount,rw", self.cache], check=True)
        r = self.purge("/soft", {"Fastly-Soft-Purge": "1"})
        self.assertEqual((r.status, r.header("Cache-Purge-Result")),
                         (200, "exact; count=1; soft"))
        self.assertServed("/soft", "EXPIRED")


if __name__ == "__main__":
    unittest.main()
