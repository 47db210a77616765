"""esid as an operator meets it: its socket (group, mode, and a worker that
may not connect), socket activation, SIGTERM, --help, and esictl."""

import grp
import os
import pwd
import signal
import socket
import stat
import subprocess
import unittest

from harness import (ESICTL, ESID, DidNotStart, EsiTestCase, STOP_BOUND,
                     poll, start_on_socket)

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


class ExitStatusTest(EsiTestCase):
    """The harness fails a test whose esid did not exit cleanly: an abort
    or a crash must not go unnoticed; a SIGKILL of the test's own is no
    failure, and neither is a SIGSTOP it resumed."""

    def teardown_problems(self, esid):
        """What the harness's teardown reports, then forgets `esid` so that
        the real teardown after the test does not report it again."""
        try:
            self._teardown()
            problems = ""
        except AssertionError as e:
            problems = str(e)
        self.processes.remove(esid)
        return problems

    def test_an_esid_that_aborts_fails_the_test(self):
        esid = self.start_esid()
        os.kill(esid.pid, signal.SIGABRT)
        esid.popen.wait(STOP_BOUND)
        problems = self.teardown_problems(esid)
        self.assertIn("esid-0 (pid %d) ended before it was stopped: killed "
                      "by SIGABRT; its stderr ends:\n    " % esid.pid,
                      problems)
        self.assertIn("listening on %s" % self.socket_path, problems)

    def test_an_esid_stopped_with_sigterm_exits_zero(self):
        esid = self.start_esid()
        self.assertEqual(self.teardown_problems(esid), "")
        self.assertEqual(esid.popen.returncode, 0)

    def test_an_esid_the_test_sigkilled_is_no_failure(self):
        esid = self.start_esid()
        esid.kill()
        self.assertEqual(self.teardown_problems(esid), "")

    def test_an_esid_the_test_stopped_and_resumed_must_exit_zero(self):
        esid = self.start_esid()
        esid.signal(signal.SIGSTOP)
        esid.signal(signal.SIGCONT)
        self.assertEqual(self.teardown_problems(esid), "")
        self.assertEqual(esid.popen.returncode, 0)


class SocketGroupTest(EsiTestCase):
    """--socket-group and --socket-mode, applied to the socket esid
    creates; a world-writable mode and an unknown group stop esid."""

    ESID = False

    def run_esid(self, *extra):
        """esid expected to refuse its command line: (exit code, stderr)."""
        r = subprocess.run([ESID, "--socket", self.socket_path] + list(extra),
                           capture_output=True, stdin=subprocess.DEVNULL,
                           timeout=30)
        return r.returncode, r.stderr.decode()

    def test_the_socket_gets_the_group_and_mode_0660(self):
        nogroup = grp.getgrnam("nogroup").gr_gid
        self.start_esid("--socket-group", "nogroup")
        st = os.stat(self.socket_path)
        self.assertEqual(st.st_gid, nogroup)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o660)
        self.assertIn("listening on %s, mode 0660, group nogroup ("
                      % self.socket_path, self.esid.stderr())

    def test_the_socket_gets_the_mode_asked_for(self):
        self.start_esid("--socket-mode", "0640")
        st = os.stat(self.socket_path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o640)
        self.assertEqual(st.st_gid, os.getegid())

    def test_the_settings_file_gives_group_and_mode(self):
        conf = os.path.join(self.tmp, "esid.conf")
        with open(conf, "w") as f:
            f.write("socket_group = nogroup\nsocket_mode = 0620\n")
        self.start_esid("--config", conf)
        st = os.stat(self.socket_path)
        self.assertEqual(st.st_gid, grp.getgrnam("nogroup").gr_gid)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o620)

    def test_a_world_writable_mode_is_refused(self):
        code, err = self.run_esid("--socket-mode", "0666")
        self.assertEqual(code, 2, err)
        self.assertIn("socket mode 0666 is world-writable", err)
        self.assertFalse(os.path.exists(self.socket_path))

    def test_an_unknown_group_is_refused(self):
        code, err = self.run_esid("--socket-group", "no-such-group-here")
        self.assertEqual(code, 2, err)
        self.assertIn('no group "no-such-group-here"', err)
        self.assertFalse(os.path.exists(self.socket_path))

    def test_check_config_prints_group_and_mode(self):
        code = subprocess.run(
            [ESID, "--socket-group", "nogroup", "--socket-mode", "640",
             "--check-config"], capture_output=True,
            stdin=subprocess.DEVNULL, timeout=30)
        self.assertEqual(code.returncode, 0, code.stderr)
        self.assertIn(b"socket_group = nogroup\nsocket_mode = 0640\n",
                      code.stdout)


class SocketActivationTest(EsiTestCase):
    ESID = False

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def test_socket_activated_esid_serves_a_page(self):
        self.start_esid_socket_activated()
        self.assertBody("/page", b"aXc")

    def test_socket_group_and_mode_are_left_to_systemd(self):
        esid = self.start_esid_socket_activated(
            "--socket-group", "nogroup", "--socket-mode", "0600")
        before = os.stat(self.socket_path)
        self.assertBody("/page", b"aXc")
        self.assertTrue(poll(lambda: "socket_group and socket_mode are "
                             "ignored: systemd passed the socket"
                             in esid.stderr()), esid.stderr())
        after = os.stat(self.socket_path)
        self.assertEqual((after.st_gid, after.st_mode),
                         (before.st_gid, before.st_mode))
        self.assertNotEqual(after.st_gid, grp.getgrnam("nogroup").gr_gid)
        self.assertNotEqual(stat.S_IMODE(after.st_mode), 0o600)


class SocketDeniedTest(EsiTestCase):
    """NGINX's workers run as nobody:nogroup and esid's socket is root's,
    mode 0660: connect() fails with EACCES.  Pages pass through
    unprocessed, and the error log says why and what to do, once for each
    time the connection is lost rather than on every retry."""

    USER = "nobody nogroup"
    ESID = False

    DENIED = ("[error]", "esi: connect() to unix:%s failed: the socket is "
              "owned by root:root with mode 0660, and this worker runs as "
              "user nobody (uid 65534) group nogroup (gid 65534); run esid "
              "with --socket-group nogroup (under systemd: "
              "SocketGroup=nogroup in esid.socket), or set nginx's \"user\" "
              "directive to a user in group root (13: Permission denied)")

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("workers run as nobody only when nginx starts as "
                          "root")
        # The workers must reach the socket and the temp dir's files.
        os.chmod(self.tmp, 0o711)
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def denials(self):
        level, text = self.DENIED
        line = text % self.socket_path
        return [l for l in self.error_log().splitlines()
                if level in l and l.endswith(line)]

    def test_pages_pass_through_and_one_error_says_why(self):
        self.start_esid()
        for _ in range(3):
            self.assertBody("/page", PAGE.encode())
        self.assertEqual(self.esi_status(3), "passthrough")
        self.assertEqual(len(self.denials()), 1, self.error_log())
        self.assertNotIn("[warn]", "\n".join(
            l for l in self.error_log().splitlines() if "connect()" in l))

    def test_the_socket_group_lets_the_workers_in(self):
        self.start_esid("--socket-group", "nogroup")
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.denials(), [])

    def test_the_error_comes_again_after_a_connection_is_lost(self):
        self.start_esid()
        self.assertBody("/page", PAGE.encode())
        self.assertEqual(len(self.denials()), 1, self.error_log())
        self.esid.stop()
        self.start_esid("--socket-group", "nogroup")
        self.assertTrue(poll(lambda: self.get("/page")[2] == b"aXc"),
                        self.error_log())
        self.esid.stop()
        self.start_esid()
        self.assertBody("/page", PAGE.encode())
        # The worker may serve that page before it sees esid go.
        self.assertTrue(poll(lambda: len(self.denials()) == 2),
                        self.error_log())


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
        self.assertEqual(stats.get("errors"), 0, stats)

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


class SilentConnectionsTest(EsiTestCase):
    """A connection to esid's socket must say its hello within 10 s, and at
    most 64 may be waiting to: past them, esid closes a new connection at
    once, with one warning, and goes on serving the workers attached."""

    REFUSED = ("closing a new connection at once: 64 others have not said "
               "hello yet (each may take 10 s)")

    def setUp(self):
        super().setUp()
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.connect(self.socket_path)
        return s

    def test_the_65th_silent_connection_is_closed_and_pages_go_on(self):
        self.assertBody("/page", b"aXc")  # the worker is attached
        silent = [self.connect() for _ in range(64)]
        extra = self.connect()
        extra.settimeout(30)
        self.assertEqual(extra.recv(1), b"")
        for s in silent:
            s.setblocking(False)
            self.assertRaises(BlockingIOError, s.recv, 1)
        self.assertTrue(poll(lambda: self.REFUSED in self.esid.stderr()),
                        self.esid.stderr())
        self.assertEqual(self.esid.stderr().count(self.REFUSED), 1)
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.esi_status(2), "processed")
        # Gone, they make room: esictl is heard again.
        for s in silent:
            s.close()
        self.assertTrue(poll(lambda: self.esictl("stats").returncode == 0))


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



def ensure_user(name, group):
    """A real unprivileged user `name` whose primary group is `group`
    (both made when missing), for tests that run as root."""
    if subprocess.run(["getent", "group", group],
                      capture_output=True).returncode != 0:
        subprocess.run(["groupadd", "--system", group], check=True)
    if subprocess.run(["getent", "passwd", name],
                      capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home",
                        "--shell", "/usr/sbin/nologin", "--gid", group,
                        name], check=True)


class EsictlRefusedTest(EsiTestCase):
    """A user in the socket's group, so connect() succeeds, but not allowed
    to control esid (no control_group): every esictl command prints esid's
    refusal and exits 1.  `esictl zones` (and on other builds `stats`) died
    with SIGSEGV there, destroying a JSON value never made (issue 33)."""

    USER_NAME = "esi-refused"
    GROUP = "esi-socket"
    COMMANDS = (["stats"], ["stats", "--json"], ["stats", "--prometheus"],
                ["top", "--once"], ["zones"], ["zones", "--json"],
                ["variants", "z", "k"], ["variants", "z", "k", "--json"],
                ["plans"], ["plans", "z"], ["plans", "--json"],
                ["purge", "z", "k"], ["purge", "z", "p", "--prefix"],
                ["purge", "z", "t", "--tag", "--json"],
                ["purge", "z", "k", "--fleet", "--wait", "1"],
                ["fleet"], ["fleet", "--json"], ["log", "--dump"],
                ["log", "--dump", "--json"], ["log"])

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("needs root to add a user and switch to it")
        ensure_user(self.USER_NAME, self.GROUP)
        os.chmod(self.tmp, 0o711)

    def test_every_command_prints_the_refusal(self):
        self.start_esid("--socket-group", self.GROUP)
        for command in self.COMMANDS:
            r = subprocess.run(
                ["runuser", "-u", self.USER_NAME, "--", ESICTL, "--socket",
                 self.socket_path] + command, capture_output=True,
                timeout=30, stdin=subprocess.DEVNULL)
            self.assertEqual(
                (r.returncode, r.stdout, r.stderr),
                (1, b"", b"esictl: esid refused: permission denied: uid %d "
                 b"may not control esid (run esictl as root or as esid's "
                 b"own user)\n" % pwd.getpwnam(self.USER_NAME).pw_uid),
                command)

class SocketDirectoryTest(EsiTestCase):
    """esid binds its socket, and gives it its group, by path: in a
    directory another user may write in, that user could swap the socket
    for a link in between (issue 33).  esid refuses such a directory
    unless systemd passed the socket; root's and esid's own are fine, and
    so is one esid's own group may write in."""

    ESID = False
    USER_NAME = "esi-daemon"
    STRANGER = "esi-stranger"

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("needs root to add users and switch to one")
        ensure_user(self.USER_NAME, self.USER_NAME)
        ensure_user(self.STRANGER, self.STRANGER)
        # esid's user must reach the directory inside the test's.
        os.chmod(self.tmp, 0o711)
        self.dir = os.path.join(self.tmp, "run")
        os.mkdir(self.dir)
        self.path = os.path.join(self.dir, "esid.sock")

    def directory(self, owner, group, mode):
        os.chown(self.dir, pwd.getpwnam(owner).pw_uid,
                 grp.getgrnam(group).gr_gid)
        os.chmod(self.dir, mode)

    def as_user(self):
        return ["setpriv", "--reuid=" + self.USER_NAME,
                "--regid=" + self.USER_NAME, "--init-groups"]

    def refusal(self, *prefix):
        """esid's exit status and stderr, refusing to start."""
        r = subprocess.run(list(prefix) + [ESID, "--socket", self.path],
                           capture_output=True, stdin=subprocess.DEVNULL,
                           timeout=30)
        self.assertFalse(os.path.exists(self.path))
        return r.returncode, r.stderr.decode()

    def test_a_directory_every_user_may_write_in_is_refused(self):
        self.directory("root", "root", 0o1777)
        code, err = self.refusal()
        self.assertEqual(code, 1, err)
        self.assertIn(
            " critical socket directory %s is owned by user root, group "
            "root, mode 1777: every user may write in it, but what esid "
            "keeps there must be esid's alone (esid runs as root); fix: "
            "chmod o-w %s\n" % (self.dir, self.dir), err)

    def test_a_directory_another_user_owns_is_refused(self):
        self.directory(self.STRANGER, self.STRANGER, 0o755)
        code, err = self.refusal()
        self.assertEqual(code, 1, err)
        self.assertIn("socket directory %s is owned by user %s, group %s, "
                      "mode 0755: its owner may write in it" % (
                          self.dir, self.STRANGER, self.STRANGER), err)
        self.assertIn("fix: chown root %s\n" % self.dir, err)

    def test_esids_own_directory_is_refused_once_others_may_write(self):
        self.directory(self.USER_NAME, self.USER_NAME, 0o777)
        code, err = self.refusal(*self.as_user())
        self.assertEqual(code, 1, err)
        self.assertIn("mode 0777: every user may write in it, but what esid "
                      "keeps there must be esid's alone (esid runs as %s); "
                      "fix: chmod o-w %s\n" % (self.USER_NAME, self.dir), err)

    def test_a_group_other_than_esids_may_not_write_in_it(self):
        self.directory(self.USER_NAME, self.STRANGER, 0o770)
        code, err = self.refusal(*self.as_user())
        self.assertEqual(code, 1, err)
        self.assertIn("group %s, mode 0770: its group may write in it" %
                      self.STRANGER, err)
        self.assertIn("fix: chmod g-w %s\n" % self.dir, err)

    def test_esid_as_its_user_takes_a_directory_its_group_may_write(self):
        self.directory("root", self.USER_NAME, 0o770)
        try:
            esid = start_on_socket(
                self.spawn, "esid-0", self.as_user() + [
                    ESID, "--socket", self.path, "--socket-mode", "0620",
                    "--socket-group", self.USER_NAME], self.path)
        except DidNotStart as e:
            self.fail("esid did not start:\n" + e.log)
        st = os.stat(self.path)
        self.assertEqual(
            (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)),
            (pwd.getpwnam(self.USER_NAME).pw_uid,
             grp.getgrnam(self.USER_NAME).gr_gid, 0o620))
        esid.signal(signal.SIGTERM)
        self.assertEqual(esid.popen.wait(STOP_BOUND), 0, esid.stderr())

    def test_under_socket_activation_the_directory_is_systemds(self):
        os.chmod(self.tmp, 0o1777)
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")
        self.start_esid_socket_activated()
        self.assertBody("/page", b"aXc")
        self.assertNotIn("socket directory", self.esid.stderr())


if __name__ == "__main__":
    unittest.main()
