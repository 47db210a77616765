"""Who may answer at esi_daemon's path (issue 33, item 2).  The worker
checks the credentials of whatever listens there (SO_PEERCRED) before it
sends its hello: root, the owner of the socket's directory, or the user
`esi_daemon_user` names.  Anything else, here another local user who bound
the path in a directory everyone may write while esid was down (with
systemd-socket-activate, handing the socket to the real esid run as that
user, since esid itself refuses to create its socket in such a directory),
gets nothing: pages pass through
as with esid down, purges answer 503, and the error log says once, for
each time the connection is lost, who listens there and what to do.
Under socket activation esid listens again on the socket systemd passes
it, and from then on the kernel names esid, not systemd: the packages make
/run/esid esid's for that (tmpfiles.d)."""

import os
import pwd
import unittest

from harness import ESID, DidNotStart, EsiTestCase, poll, start_on_socket
from test_esid import ensure_user
import test_limits
from test_purge import SEPARATE_LOCATION

PAGE = 'a<esi:include src="/esi/x"/>c'
PROCESSED = b"aXc"
RAW = PAGE.encode()

STRANGER = "esi-peer"
STRANGER_GROUP = "esi-peer"

REFUSED = ("esi: connect() to unix:%(socket)s refused: the process "
           "listening there, pid %(pid)d, runs as user %(user)s (uid "
           "%(uid)d), but esid must run as root, as the owner of the "
           "socket's directory %(dir)s (%(owner)s) or as "
           "\"esi_daemon_user\" (%(allowed)s); nothing was sent to it and "
           "esi streams fall back: stop that process and run esid as one "
           "of those, or if it is your esid, set \"esi_daemon_user "
           "%(user)s;\" in nginx's http block")

class PeerTestCase(EsiTestCase):
    ESID = False

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("needs root to add a user and run esid as it")
        ensure_user(STRANGER, STRANGER_GROUP)
        self.stranger = pwd.getpwnam(STRANGER)
        # The stranger's esid must reach its directory inside the temp dir.
        os.chmod(self.tmp, 0o711)
        self.origin.route("/page", PAGE)
        self.origin.route("/esi/x", "X")

    def directory(self, name, mode, owner=0):
        """A directory for esid's socket, owned by `owner` with `mode`;
        nginx is pointed at the socket in it."""
        path = os.path.join(self.tmp, name)
        os.mkdir(path)
        os.chown(path, owner, -1)
        os.chmod(path, mode)
        self.socket_path = os.path.join(path, "esid.sock")
        return path

    def as_stranger(self, argv):
        return ["setpriv", "--reuid=" + STRANGER,
                "--regid=" + STRANGER_GROUP, "--clear-groups"] + argv

    def start_esid_as_stranger(self):
        """The real esid, run as the stranger in a directory it owns:
        setpriv execs it, so its pid is the one that listens."""
        argv = self.as_stranger([ESID, "--socket", self.socket_path]
                                + list(self.ESID_ARGS))
        try:
            self.esid = start_on_socket(
                self.spawn, "esid-stranger-%d" % len(self.processes), argv,
                self.socket_path)
        except DidNotStart as e:
            self.fail("esid as %s did not come up on %s:\n%s" % (
                STRANGER, self.socket_path, e.log))
        return self.esid

    def bind_as_stranger(self):
        """The stranger binds the path in a directory anyone may write and
        hands the socket to the real esid run as it; setpriv execs
        systemd-socket-activate, which execs esid on the first connection:
        one pid throughout."""
        return self.start_esid_socket_activated(binder=self.as_stranger)

    def expected_refusal(self, pid):
        """The line for the stranger's esid, pid `pid`, in a directory of
        root's (self.dir) without esi_daemon_user."""
        return REFUSED % {
            "socket": self.socket_path, "pid": pid, "user": STRANGER,
            "uid": self.stranger.pw_uid, "dir": self.dir,
            "owner": "user root, uid 0", "allowed": "not set"}

    def refusals(self):
        return [l for l in self.error_log().splitlines()
                if "[error]" in l and "refused: the process listening" in l]

    def esid_connections(self):
        """Worker connections esid took (its hello answered)."""
        return self.stats_json()["connections"]


class StrangerRefusedTest(PeerTestCase):
    """Another user's process bound the path in a directory of root's
    that everyone may write (mode 1777): refused."""

    LOCATIONS = SEPARATE_LOCATION

    def setUp(self):
        super().setUp()
        self.dir = self.directory("shared", 0o1777)

    def test_pages_pass_through_and_one_error_names_the_peer(self):
        esid = self.bind_as_stranger()
        for _ in range(3):
            self.assertBody("/page", RAW)
        for nth in (1, 2, 3):
            self.assertEqual(self.esi_status(nth), "passthrough")
        refusals = self.refusals()
        self.assertEqual(len(refusals), 1, self.error_log())
        self.assertTrue(refusals[0].endswith(self.expected_refusal(
            esid.pid)), refusals[0])
        # Nothing reached it: it never took a worker's hello.
        self.assertEqual(self.esid_connections(), 0)
        self.assertNotIn("attached to esid", self.error_log())

    def test_a_purge_is_not_sent_to_it(self):
        self.bind_as_stranger()
        self.assertBody("/page", RAW)
        r = self.fetch("/purge/page")
        self.assertEqual(r.status, 503, r)
        self.assertIn(b"esid is not connected", r.body)
        self.assertEqual(len(self.refusals()), 1, self.error_log())
        self.assertEqual(self.esid_connections(), 0)

    def test_the_error_comes_again_after_a_connection_is_lost(self):
        first = self.bind_as_stranger()
        self.assertBody("/page", RAW)
        self.assertEqual(len(self.refusals()), 1, self.error_log())
        first.stop()
        # root's esid in the same directory is trusted: the peer decides,
        # not the directory's mode.
        self.start_esid_socket_activated()
        self.assertTrue(poll(lambda: self.get("/page")[2] == PROCESSED),
                        self.error_log())
        self.esid.stop()
        second = self.bind_as_stranger()
        self.assertBody("/page", RAW)
        # The worker may serve that page before it sees esid go.
        self.assertTrue(poll(lambda: len(self.refusals()) == 2),
                        self.error_log())
        self.assertTrue(self.refusals()[1].endswith(self.expected_refusal(
            second.pid)), self.refusals()[1])
        self.assertEqual(self.esid_connections(), 0)


class StrangerAbortTest(PeerTestCase):
    """esi_fallback abort applies to a refused esid as to a dead one."""

    LOCATION = "esi_fallback abort;"

    def test_the_page_is_aborted(self):
        self.directory("shared", 0o1777)
        self.bind_as_stranger()
        r = self.fetch("/page")
        self.assertTrue(not r.complete or r.status >= 500, r)
        self.assertNotEqual(r.body, RAW)
        self.assertEqual(self.esi_status(1), "aborted")
        self.assertEqual(len(self.refusals()), 1, self.error_log())
        self.assertEqual(self.esid_connections(), 0)


class DaemonUserTest(PeerTestCase):
    """esi_daemon_user names the stranger: trusted, in the same shared
    directory."""

    HTTP = "esi_daemon_user %s;" % STRANGER

    def test_its_esid_processes_pages(self):
        self.directory("shared", 0o1777)
        self.bind_as_stranger()
        self.assertBody("/page", PROCESSED)
        self.assertEqual(self.esi_status(1), "processed")
        self.assertEqual(self.refusals(), [])
        self.assertEqual(self.esid_connections(), 1)


class TrustedPeerTest(PeerTestCase):
    """root anywhere, and the owner of the socket's directory."""

    def test_root_in_a_shared_directory(self):
        self.directory("shared", 0o1777)
        self.start_esid_socket_activated()
        self.assertBody("/page", PROCESSED)
        self.assertEqual(self.refusals(), [])

    def test_the_owner_of_the_directory(self):
        self.directory("own", 0o755, owner=self.stranger.pw_uid)
        self.start_esid_as_stranger()
        self.assertBody("/page", PROCESSED)
        self.assertEqual(self.esi_status(1), "processed")
        self.assertEqual(self.refusals(), [])


class SocketActivatedPeerTest(PeerTestCase):
    """Under socket activation SO_PEERCRED names whoever called listen()
    last: systemd (here systemd-socket-activate, root) until esid starts,
    then esid itself, which listens again on the socket it was passed.
    The packages' esid runs as user esid, so it is trusted as the owner of
    /run/esid (their tmpfiles.d entry makes it esid's), not as root.  A
    worker's first connection, made before esid started, is root's; the
    one a new worker makes is esid's."""

    def new_worker(self):
        """SIGKILL the worker; its successor connects to esid anew."""
        old = self.worker_pids()
        self.kill_worker(old[0])
        self.assertTrue(poll(lambda: (lambda pids: len(pids) == 1
                                      and pids != old)(self.worker_pids())))

    def test_in_its_own_directory_esid_is_trusted_after_it_listens(self):
        self.directory("own", 0o755, owner=self.stranger.pw_uid)
        self.start_esid_socket_activated(daemon=self.as_stranger)
        self.assertBody("/page", PROCESSED)
        self.new_worker()
        self.assertBody("/page", PROCESSED)
        self.assertEqual(self.error_log().count("attached to esid"), 2,
                         self.error_log())
        self.assertEqual(self.refusals(), [])

    def test_in_a_directory_of_roots_esid_is_refused_once_it_listens(self):
        self.dir = self.directory("shared", 0o1777)
        esid = self.start_esid_socket_activated(daemon=self.as_stranger)
        self.assertBody("/page", PROCESSED)
        self.new_worker()
        self.assertBody("/page", RAW)
        refusals = self.refusals()
        self.assertEqual(len(refusals), 1, self.error_log())
        self.assertTrue(refusals[0].endswith(self.expected_refusal(
            esid.pid)), refusals[0])


class DaemonUserConfigurationTest(PeerTestCase):
    """An unknown esi_daemon_user stops `nginx -t`; a known one passes."""

    def nginx_t(self, http):
        self.HTTP = http
        return test_limits.ConfigurationErrorTest.nginx_t(self, self.LOCATION)

    def test_an_unknown_user_stops_nginx_t(self):
        code, out = self.nginx_t("esi_daemon_user no-such-user-here;")
        self.assertNotEqual(code, 0, out)
        self.assertIn('"esi_daemon_user": no user "no-such-user-here"', out)

    def test_a_second_one_stops_nginx_t(self):
        code, out = self.nginx_t("esi_daemon_user %s;\n"
                                 "esi_daemon_user root;" % STRANGER)
        self.assertNotEqual(code, 0, out)
        self.assertIn('"esi_daemon_user" directive is duplicate', out)

    def test_a_known_user_passes(self):
        code, out = self.nginx_t("esi_daemon_user %s;" % STRANGER)
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
