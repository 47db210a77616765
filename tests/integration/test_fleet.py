"""The fleet: three NGINX + esid nodes on loopback, each with its own cache
and socket, and one real redis-server (appendonly, in the test's temp dir).
A purge at one node, in any form, leaves no file at the others and their
next request is a MISS; a node whose esid was down replays what it missed;
a Redis restarted between two purges loses neither; a node that finds the
entries it needed trimmed from the stream purges its zones whole (or only
says so, with fleet_on_gap = log); entries that are not purges are skipped.
Everything waits on observable state (files, counters, state files)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import unittest

from harness import ESID, DidNotStart, EsiTestCase, Node, free_port, poll, \
    start_nginx
from test_esid import ensure_user

REDIS = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
STREAM = "esi:purges"

# The harness's "location /" caches in zone "pages"; PURGE purges there,
# /purge/KEY* purges a prefix.
PURGE_HERE = """
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
"""
PURGE_LOCATION = """
        location ~ ^/purge(/.*)$ {
            allow 127.0.0.1;
            deny all;
            esi_cache_purge zone=pages key=$1$is_args$args;
        }
"""


def redis_answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@unittest.skipIf(REDIS is None or REDIS_CLI is None,
                 "redis-server not installed (packaging/deps.sh installs it)")
class FleetTestCase(EsiTestCase):
    ESID = False
    LOCATION = PURGE_HERE
    LOCATIONS = PURGE_LOCATION
    NODES = ("a", "b", "c")
    ON_GAP = "purge_all"

    def setUp(self):
        super().setUp()
        self.redis_port = free_port()
        self.redis_dir = os.path.join(self.tmp, "redis")
        os.mkdir(self.redis_dir)
        self.start_redis()
        self.fleet = {}
        for name in self.NODES:
            node = self.add_node(name)
            self.fleet[name] = node
            with open(os.path.join(node.tmp, "esid.conf"), "w") as f:
                f.write(self.fleet_settings() +
                        "fleet_node = %s\nstate_dir = %s\nfleet_on_gap = %s\n"
                        % (name, node.tmp, self.ON_GAP))
            self.start_fleet_esid(node)
            node.start_nginx()
        for node in self.fleet.values():
            self.await_reading(node)

    # -- the pieces ------------------------------------------------------

    def start_redis(self):
        self.redis = self.spawn_redis(self.redis_port, self.redis_dir)

    def spawn_redis(self, port, directory):
        proc = self.spawn("redis-%d" % len(self.processes), [
            REDIS, "--port", str(port), "--bind", "127.0.0.1",
            "--dir", directory, "--appendonly", "yes", "--save", "",
            "--daemonize", "no"])
        if not poll(lambda: not proc.alive()
                    or redis_answers(port)) or not proc.alive():
            self.fail("redis-server did not start:\n%s" % proc.stderr())
        return proc

    def fleet_settings(self):
        """The settings that say where Redis is and how to reach it."""
        return "fleet = redis://127.0.0.1:%d/0\n" % self.redis_port

    def redis_cli_connection(self):
        return ["-p", str(self.redis_port)]

    def redis_cli(self, *args):
        r = subprocess.run([REDIS_CLI] + self.redis_cli_connection() +
                           list(args), capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.decode().strip()

    def start_fleet_esid(self, node):
        return node.start_esid("--config", os.path.join(node.tmp, "esid.conf"))

    def state_file(self, node):
        return os.path.join(node.tmp, "fleet-esi_purges.state")

    def await_reading(self, node):
        """A node reads once it knows where it is on the stream (its state
        file) and its workers attached; it is listed once its heartbeat is
        in Redis."""
        self.assertTrue(poll(lambda: os.path.exists(self.state_file(node))),
                        "%s never found its place on the stream" % node.name)
        self.assertTrue(poll(lambda: self.redis_cli(
            "HEXISTS", STREAM + ":nodes", node.name) == "1"),
            "%s never told the fleet it is there" % node.name)

    def fleet_stats(self, node):
        r = node.esictl("stats", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return {k: v for k, v in json.loads(r.stdout).items()
                if k.startswith("fleet_")}

    def cache_everywhere(self, *paths):
        for path in paths:
            self.origin.route(path, "body of %s" % path,
                              headers=[("Surrogate-Key", "t-" + path[1:])])
        for node in self.fleet.values():
            for path in paths:
                _, headers, _ = node.get(path)
                self.assertEqual(headers.get("X-Cache-Status"), "MISS")
                _, headers, _ = node.get(path)
                self.assertEqual(headers.get("X-Cache-Status"), "HIT")
            self.assertEqual(len(node.cache_files()), len(paths), node.name)

    def await_files(self, node, count):
        self.assertTrue(poll(lambda: len(node.cache_files()) == count),
                        "%s keeps %s, not %d file(s)" % (
                            node.name, node.cache_files(), count))

    def assertMiss(self, node, path):
        _, headers, _ = node.get(path)
        self.assertEqual(headers.get("X-Cache-Status"), "MISS",
                         "%s %s" % (node.name, path))

    def purge(self, node, path, headers=None):
        r = node.fetch(path, headers, method="PURGE")
        self.assertTrue(r.complete, r)
        self.assertEqual(r.status, 200, r.body)
        return r


class FleetPurgeTest(FleetTestCase):
    def test_a_purge_at_one_node_leaves_no_file_at_the_others(self):
        self.cache_everywhere("/p", "/keep")
        r = self.purge(self.fleet["a"], "/p")
        self.assertEqual(r.header("Cache-Purge-Fleet"), "published")
        for name in ("b", "c"):
            self.await_files(self.fleet[name], 1)
            self.assertMiss(self.fleet[name], "/p")
            _, headers, _ = self.fleet[name].get("/keep")
            self.assertEqual(headers.get("X-Cache-Status"), "HIT")
        stats = self.fleet_stats(self.fleet["a"])
        self.assertEqual(stats["fleet_published"], 1)
        self.assertTrue(poll(lambda: self.fleet_stats(self.fleet["b"])
                             ["fleet_applied"] == 1))
        # Applied from the fleet, not published again: one entry in all.
        self.assertEqual(self.redis_cli("XLEN", STREAM), "1")
        self.assertEqual(self.fleet_stats(self.fleet["b"])["fleet_published"], 0)

    def test_a_tag_purge_reaches_every_node(self):
        self.cache_everywhere("/t1", "/t2")
        r = self.purge(self.fleet["b"], "/", {"Surrogate-Key": "t-t1"})
        self.assertEqual(r.header("Cache-Purge-Result"), "tag; count=1")
        for name in ("a", "c"):
            self.await_files(self.fleet[name], 1)
            self.assertMiss(self.fleet[name], "/t1")

    def test_a_wildcard_purge_reaches_every_node(self):
        self.cache_everywhere("/shop/1", "/shop/2", "/about")
        r = self.fleet["c"].fetch("/purge/shop*")
        self.assertEqual(r.status, 200, r.body)
        for name in ("a", "b"):
            self.await_files(self.fleet[name], 1)
            self.assertMiss(self.fleet[name], "/shop/2")

    def test_esictl_purge_waits_for_every_node_to_apply_it(self):
        self.cache_everywhere("/e")
        r = self.fleet["a"].esictl("purge", "--fleet", "--wait", "30",
                                   "pages", "/e")
        out = r.stdout.decode()
        self.assertEqual(r.returncode, 0, out + r.stderr.decode())
        self.assertIn("fleet: published", out)
        for name in ("a", "b", "c"):
            self.assertIn("%s: 1 file(s)" % name, out)
        for name in ("b", "c"):
            self.assertEqual(self.fleet[name].cache_files(), [])

    def test_esictl_fleet_lists_every_node(self):
        def listed():
            r = self.fleet["b"].esictl("fleet", "--json")
            if r.returncode != 0:
                return None
            nodes = json.loads(r.stdout)["nodes"]
            return sorted(n["node"] for n in nodes) == ["a", "b", "c"]
        self.assertTrue(poll(listed))
        r = self.fleet["b"].esictl("fleet")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn("node b", r.stdout.decode())


class FleetRestartTest(FleetTestCase):
    def test_a_node_whose_esid_was_killed_replays_what_it_missed(self):
        self.cache_everywhere("/r1", "/r2", "/keep")
        b = self.fleet["b"]
        b.esid.kill()
        self.purge(self.fleet["a"], "/r1")
        self.purge(self.fleet["c"], "/r2")
        self.await_files(self.fleet["a"], 1)
        self.await_files(self.fleet["c"], 1)
        self.assertEqual(len(b.cache_files()), 3)  # nobody could tell b
        self.start_fleet_esid(b)
        self.await_files(b, 1)
        self.assertMiss(b, "/r1")
        self.assertMiss(b, "/r2")
        self.assertEqual(self.fleet_stats(b)["fleet_gaps"], 0)

    def test_purges_on_both_sides_of_a_redis_restart_reach_every_node(self):
        self.cache_everywhere("/x1", "/x2", "/x3")
        a = self.fleet["a"]
        self.purge(a, "/x1")
        for node in self.fleet.values():
            self.await_files(node, 2)
        self.redis.stop()
        self.assertTrue(poll(lambda: self.fleet_stats(a)["fleet_connected"] == 0))
        r = a.esictl("purge", "--json", "pages", "/x2")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(json.loads(r.stdout)["fleet"], "pending")
        # over HTTP too, the answer says the fleet has it yet to come
        r = self.purge(a, "/x3")
        self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        self.assertEqual(a.cache_files(), [])  # local purges work as ever
        self.start_redis()
        for node in self.fleet.values():
            self.await_files(node, 0)
        for path in ("/x1", "/x2", "/x3"):
            self.assertMiss(self.fleet["c"], path)
        self.assertEqual(self.fleet_stats(a)["fleet_published"], 3)


class OtherZoneNode(Node):
    """A second NGINX on a node's esid whose one cache zone is "other", not
    "pages": that esid's workers serve a zone while "pages" is away."""

    def __init__(self, test, node):
        super().__init__(test, node.name + "-other")
        self.socket_path = node.socket_path

    def start_nginx(self):
        def conf(port):
            self.port = port
            return self.test.nginx_conf(self.tmp, self.socket_path,
                                        port).replace("pages", "other")
        try:
            self.nginx, _ = start_nginx(self.test.spawn,
                                        "%s-nginx" % self.name, self.tmp,
                                        conf, self.test.sanitizer_env())
        except DidNotStart as e:
            self.test.fail("%s: nginx did not start:\n%s" % (self.name,
                                                              e.log))


class FleetNginxAwayCase(FleetTestCase):
    """b's esid also serves an NGINX of another zone, so that it reads on
    while b's own NGINX ("pages") is down."""
    NODES = ("a", "b")

    def start_other_zone(self):
        b = self.fleet["b"]
        other = OtherZoneNode(self, b)
        self.nodes.append(other)
        other.start_nginx()
        self.assertTrue(poll(lambda: "zone other at" in b.esid.stderr()))
        return other

    def await_waiting(self):
        """b read an entry of "pages" and said why it cannot apply it."""
        b = self.fleet["b"]
        self.assertTrue(poll(lambda: 'no NGINX worker here serves zone "pages"'
                             in b.esid.stderr()), b.esid.stderr())

    def purge_while_pages_is_away(self, path):
        self.fleet["b"].nginx.stop()
        self.purge(self.fleet["a"], path)
        self.await_waiting()


class FleetNginxAwayTest(FleetNginxAwayCase):
    """Entries for a zone whose NGINX is away wait for it, however long,
    across an esid restart too (the lost purges of issue 36: they were
    skipped, "no NGINX worker here serves zone", and the position moved
    past them)."""

    def test_purges_made_while_nginx_was_away_are_applied_once_it_is_back(
            self):
        self.cache_everywhere("/s1", "/s2", "/keep")
        b = self.fleet["b"]
        other = self.start_other_zone()
        self.purge_while_pages_is_away("/s1")
        # stopped as systemd stops a node: NGINX first, then esid
        other.nginx.stop()
        b.esid.stop()
        self.purge(self.fleet["a"], "/s2")
        self.start_fleet_esid(b)
        other.start_nginx()  # reading goes on; "pages" is not back yet
        self.assertTrue(poll(lambda: "zone other at" in b.esid.stderr()))
        self.await_waiting()
        self.assertEqual(len(b.cache_files()), 3)
        r = b.esictl("fleet")
        self.assertRegex(r.stdout.decode(), r"waiting at entry \d+-\d+: no "
                         r'NGINX worker here serves zone "pages" now\n')
        b.start_nginx()
        self.await_files(b, 1)
        self.assertMiss(b, "/s1")
        self.assertMiss(b, "/s2")
        _, headers, _ = b.get("/keep")
        self.assertEqual(headers.get("X-Cache-Status"), "HIT")
        stats = self.fleet_stats(b)
        self.assertEqual((stats["fleet_applied"], stats["fleet_skipped"]),
                         (2, 0))


class FleetNginxAwayGapTest(FleetNginxAwayCase):
    """A node that waits for its NGINX and then finds the stream reset
    reads on from the new stream's start, not waiting still (it parked
    for good)."""
    ON_GAP = "log"

    def test_a_stream_reset_while_an_entry_waits_for_nginx(self):
        self.cache_everywhere("/first", "/s1", "/later", "/keep")
        b = self.fleet["b"]
        self.purge(self.fleet["a"], "/first")  # b's position: past it
        self.await_files(b, 3)
        self.start_other_zone()
        self.purge_while_pages_is_away("/s1")
        self.redis_cli("DEL", STREAM)  # /s1's entry lost: a gap
        b.start_nginx()
        self.assertTrue(poll(lambda: self.fleet_stats(b)["fleet_gaps"] == 1))
        self.purge(self.fleet["a"], "/later")
        self.await_files(b, 2)
        self.assertMiss(b, "/later")


class FleetHungRedisTest(FleetTestCase):

    def test_a_redis_that_hangs_is_dropped_and_its_purges_go_out_after(self):
        self.cache_everywhere("/h1", "/h2")
        a = self.fleet["a"]

        def writer(what):
            return len(re.findall("fleet writer: " + what, a.esid.stderr()))
        self.assertEqual(writer("connected to"), 1)
        self.redis.signal(signal.SIGSTOP)
        try:
            # answered at once: no request waits on Redis
            r = self.purge(a, "/h1")
            self.assertEqual(len(a.cache_files()), 1)
            # The connection purges go out on is dropped (2 s without an
            # answer), and each one after: the kernel connects to a stopped
            # Redis all the same, but esid takes none for live before Redis
            # answered on it.  (It did: connected, and a purge answered
            # `published`, until that connection's first command timed out.)
            self.assertTrue(poll(lambda: writer("[^\n]*; next attempt in")
                                 or writer("connected to") > 1, bound=20.0),
                            "esid kept a Redis that does not answer")
            self.assertEqual(writer("connected to"), 1,
                             "esid connected to a Redis that does not "
                             "answer:\n" + a.esid.stderr())
            self.assertTrue(poll(lambda: self.fleet_stats(a)
                                 ["fleet_connected"] == 0, bound=20.0),
                            "esid counts a Redis that does not answer")
            r = self.purge(a, "/h2")
            self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        finally:
            self.redis.signal(signal.SIGCONT)
        for node in self.fleet.values():
            self.await_files(node, 0)
        for path in ("/h1", "/h2"):
            self.assertMiss(self.fleet["b"], path)


class FleetReplicaTest(FleetTestCase):
    """The primary esid writes to becomes a read-only replica (REPLICAOF,
    as a failover leaves the old primary): its purges are `pending`, not
    `published` (issue 36: they were answered `published` while Redis
    refused every entry), and go out once it is a primary again."""
    NODES = ("a", "b")

    def test_purges_wait_while_redis_is_a_replica(self):
        self.cache_everywhere("/ro1", "/ro2", "/keep")
        a = self.fleet["a"]
        other_port = free_port()
        other_dir = os.path.join(self.tmp, "redis-other")
        os.mkdir(other_dir)
        self.spawn_redis(other_port, other_dir)
        self.redis_cli("REPLICAOF", "127.0.0.1", str(other_port))
        # found out by the heartbeat's write, with no purge to tell
        self.assertTrue(poll(lambda: "READONLY" in a.esid.stderr()),
                        a.esid.stderr())
        for path in ("/ro1", "/ro2"):
            r = self.purge(a, path)
            self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        self.assertIn("it is a read-only replica (ROLE), not the primary",
                      a.esid.stderr())
        stats = self.fleet_stats(a)
        self.assertEqual((stats["fleet_connected"], stats["fleet_published"],
                          stats["fleet_pending"]), (0, 0, 2))
        self.redis_cli("REPLICAOF", "NO", "ONE")
        b = self.fleet["b"]
        self.await_files(b, 1)
        self.assertMiss(b, "/ro1")
        self.assertMiss(b, "/ro2")
        self.assertEqual(self.fleet_stats(a)["fleet_published"], 2)


class GarbageRedisTest(EsiTestCase):
    """A "Redis" that answers garbage: esid drops it, says so, keeps
    retrying, and purges locally as ever."""
    LOCATION = PURGE_HERE
    ESID = False

    def setUp(self):
        super().setUp()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.addCleanup(self.listener.close)
        self.accepted = 0

        def answer_garbage():
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    return
                self.accepted += 1
                try:
                    conn.recv(4096)
                    conn.sendall(b"this is not RESP\r\n")
                except OSError:
                    pass
                conn.close()

        threading.Thread(target=answer_garbage, daemon=True).start()
        conf = os.path.join(self.tmp, "esid.conf")
        with open(conf, "w") as f:
            f.write("fleet = redis://127.0.0.1:%d/0\nfleet_node = g\n"
                    "state_dir = %s\n" % (self.listener.getsockname()[1],
                                           self.tmp))
        self.start_esid("--config", conf)

    def test_esid_drops_it_retries_and_purges_locally(self):
        self.origin.route("/g", "g")
        self.assertEqual(self.get("/g")[1].get("X-Cache-Status"), "MISS")
        r = self.fetch("/g", method="PURGE")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        self.assertTrue(poll(lambda: self.accepted >= 2),
                        "esid did not connect again")
        self.assertTrue(self.esid.alive())
        self.assertIn("retrying, every", self.esid.stderr())


class StateDirTest(EsiTestCase):
    """esid keeps its place on the stream in state_dir, as root perhaps: a
    directory another user may write in is refused, and a link at the
    state file's name is an error naming it, never followed, never quoted
    (issue 33: a link to a root-only file had its first line logged).  No
    Redis needed: esid checks before it connects."""

    ESID = False
    STRANGER = "esi-stranger"
    FLEET = ("--fleet", "redis://127.0.0.1:1/0")  # never reached

    def setUp(self):
        super().setUp()
        self.state_dir = os.path.join(self.tmp, "state")
        os.mkdir(self.state_dir, 0o700)

    def run_esid(self, *fleet):
        """esid expected to stop at once: (exit status, stderr)."""
        argv = [ESID, "--socket", self.socket_path, "--fleet-node", "n",
                "--state-dir", self.state_dir] + list(fleet)
        r = subprocess.run(argv, capture_output=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        return r.returncode, r.stderr.decode()

    def test_a_state_dir_every_user_may_write_in_is_refused(self):
        os.chmod(self.state_dir, 0o777)
        code, err = self.run_esid(*self.FLEET)
        self.assertEqual(code, 1, err)
        self.assertIn(" critical state_dir %s is owned by user root, group "
                      "root, mode 0777: every user may write in it, but what "
                      "esid keeps there must be esid's alone (esid runs as "
                      "root); fix: chmod o-w %s\n" % (
                          self.state_dir, self.state_dir), err)

    def test_a_state_dir_another_user_owns_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to add a user")
        ensure_user(self.STRANGER, self.STRANGER)
        shutil.chown(self.state_dir, self.STRANGER, self.STRANGER)
        code, err = self.run_esid(*self.FLEET)
        self.assertEqual(code, 1, err)
        self.assertIn("state_dir %s is owned by user %s" % (
            self.state_dir, self.STRANGER), err)

    def test_without_a_fleet_state_dir_is_not_used(self):
        os.chmod(self.state_dir, 0o777)
        self.start_esid("--state-dir", self.state_dir)
        self.assertNotIn("state_dir", self.esid.stderr())

    def test_a_link_at_the_state_files_name_is_refused_unread(self):
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write("root-only-first-line\n")
        os.chmod(secret, 0o600)
        state = os.path.join(self.state_dir, "fleet-esi_purges.state")
        os.symlink(secret, state)
        code, err = self.run_esid(*self.FLEET)
        self.assertEqual(code, 1, err)
        self.assertIn(" critical %s is a symbolic link, which esid does not "
                      "follow: remove it (esid writes a new file)\n" % state,
                      err)
        self.assertNotIn("root-only", err)


class FleetGapCase(FleetTestCase):
    def make_gap(self):
        """c is down while a purges /g and the stream is trimmed."""
        self.cache_everywhere("/g", "/untouched")
        c = self.fleet["c"]
        c.esid.stop()
        self.purge(self.fleet["a"], "/g")
        self.await_files(self.fleet["b"], 1)
        self.redis_cli("XTRIM", STREAM, "MAXLEN", "0")
        self.start_fleet_esid(c)
        self.assertTrue(poll(lambda: self.fleet_stats(c)["fleet_gaps"] == 1))
        return c


class FleetGapTest(FleetGapCase):
    def test_a_node_that_lost_purges_purges_its_zone_entirely(self):
        c = self.make_gap()
        self.await_files(c, 0)  # the unpurged /untouched went too
        self.assertMiss(c, "/untouched")
        self.assertIn("purges lost", c.esid.stderr())
        _, headers, _ = self.fleet["b"].get("/untouched")
        self.assertEqual(headers.get("X-Cache-Status"), "HIT")


class FleetGapLogTest(FleetGapCase):
    ON_GAP = "log"

    def test_with_on_gap_log_a_node_only_says_so(self):
        c = self.make_gap()
        self.assertIn("fleet_on_gap = log", c.esid.stderr())
        self.assertEqual(len(c.cache_files()), 2)


class FleetBadEntryTest(FleetTestCase):
    NODES = ("a", "b")

    def test_entries_that_are_not_purges_are_skipped_and_esid_lives(self):
        self.cache_everywhere("/ok", "/keep")
        base = ["XADD", STREAM, "*", "v", "1", "node", "evil", "uid", "e:1:1"]
        self.redis_cli(*base, "zone", "pages", "kind", "flushall", "value", "x")
        self.redis_cli(*base, "zone", "nosuchzone", "kind", "key", "value", "/keep")
        self.redis_cli(*base, "zone", "pages", "kind", "key",
                       "value", "/" + "k" * 70000)
        self.redis_cli("XADD", STREAM, "*", "garbage", "1")
        self.redis_cli(*base, "zone", "pages", "kind", "key", "value", "/keep",
                       "command", "FLUSHALL")
        self.purge(self.fleet["a"], "/ok")
        b = self.fleet["b"]
        self.await_files(b, 1)
        self.assertTrue(poll(lambda: self.fleet_stats(b)["fleet_skipped"] == 5))
        self.assertTrue(b.esid.alive())
        _, headers, _ = b.get("/keep")
        self.assertEqual(headers.get("X-Cache-Status"), "HIT")


if __name__ == "__main__":
    unittest.main()
