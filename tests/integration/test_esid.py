"""esid as an operator meets it: its socket, socket activation, SIGTERM,
--help, and esictl."""

import os
import signal
import stat
import subprocess
import unittest

from harness import ESICTL, ESID, EsiTestCase, STOP_BOUND, poll

PAGE = 'a<esi:include src="/esi/x"/>c'


class SocketTest(EsiTestCase):

    def test_socket_is_not_world_writable(self):
        self.start_esid()
        mode = os.stat(self.socket_path).st_mode
        self.assertTrue(stat.S_ISSOCK(mode))
        self.assertEqual(mode & 0o002, 0, oct(mode))

    def test_esid_exits_zero_on_sigterm(self):
        esid = self.start_esid()
        esid.signal(signal.SIGTERM)
        self.assertEqual(esid.popen.wait(STOP_BOUND), 0, esid.stderr())

    def test_help_names_the_socket_option(self):
        r = subprocess.run([ESID, "--help"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=30)
        self.assertEqual(r.returncode, 0)
        self.assertIn(b"--socket", r.stdout + r.stderr)


class SocketActivationTest(EsiTestCase):
    ESID = False

    def test_socket_activated_esid_serves_a_page(self):
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")
        self.start_esid_socket_activated()
        self.assertBody("/page", b"aXc")


class EsictlTest(EsiTestCase):

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def test_stats_count_processed_pages_and_includes(self):
        for _ in range(3):
            self.assertBody("/page", b"aXc")
        stats = self.stats()
        self.assertGreaterEqual(stats.get("streams", -1), 3, stats)
        self.assertGreater(stats.get("includes", -1), 0, stats)
        self.assertGreater(stats.get("bytes", -1), 0, stats)
        self.assertIn("errors", stats)

    def test_stats_json_has_the_same_keys(self):
        self.assertBody("/page", b"aXc")
        text = self.stats()
        doc = self.stats_json()
        for key in ("streams", "bytes", "includes", "errors"):
            self.assertIsInstance(doc.get(key), int, doc)
            self.assertIn(key, text)

    def test_stats_against_a_missing_socket_fails_clearly(self):
        missing = os.path.join(self.tmp, "nothing-here.sock")
        r = self.esictl("stats", socket_path=missing)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(missing.encode(), r.stderr)
        self.assertEqual(r.stdout, b"")


class ControlCredentialsTest(EsiTestCase):
    """Control commands check the caller's credentials, not just the
    socket's mode: a socket made world-writable by mistake still refuses
    strangers, and says so in esid's log; control_group lets a group in."""

    def esictl_as_nobody(self):
        # nobody must reach the socket: search permission on the test dir
        os.chmod(self.tmp, 0o711)
        os.chmod(self.socket_path, 0o666)
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup",
                "--clear-groups", ESICTL, "--socket", self.socket_path,
                "stats"]
        return subprocess.run(argv, capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL)

    def test_a_stranger_is_refused_and_logged(self):
        self.start_esid()
        r = self.esictl_as_nobody()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(b"permission denied: uid 65534", r.stderr)
        self.assertTrue(poll(lambda: "control: uid 65534 gid 65534" in
                             self.esid.stderr()))

    def test_members_of_the_control_group_are_allowed(self):
        self.start_esid("--control-group", "nogroup")
        r = self.esictl_as_nobody()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(b"streams", r.stdout)


if __name__ == "__main__":
    unittest.main()
