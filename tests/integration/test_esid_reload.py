"""esid's SIGHUP (`systemctl reload esid`): it re-reads its --config file
and applies what changed as README and esid(8) say: log_level and
plan_store at once (the default plan zone evicting what no longer fits),
ring_size for workers that connect afterwards; the worker's connection
and a page in the middle of its body are untouched; a file that cannot be
read or parsed is refused with its reason and changes nothing; a setting
that only a restart changes is kept and named; the command line still
overrides the file.  Every step waits for esid's own log lines,
never for time."""

import json
import os
import signal
import threading
import unittest

from harness import EsiTestCase, poll

MB = 1024 * 1024

# 20 includes in 3 KB of text: a plan of some 14 KB (esictl plans)
PAGE = "".join('<p>%s</p><esi:include src="/esi/x?%d"/>' % ("t" * 100, i)
               for i in range(20))
ASSEMBLED = ("<p>%s</p>X" % ("t" * 100) * 20).encode()


class ReloadTestCase(EsiTestCase):
    ESID_ARGS = ()          # every setting from the file, unless a test
                            # gives a flag

    def setUp(self):
        super().setUp()
        self.conf = os.path.join(self.tmp, "esid.conf")
        self.origin.prefix("/esi/x", "X")
        self.origin.prefix("/esi/y", "Y")

    def write_settings(self, text):
        with open(self.conf, "w") as f:
            f.write(text)

    def start_esid_with(self, text, *flags):
        self.write_settings(text)
        self.start_esid("--config", self.conf, *flags)
        self.start()

    def esid_lines(self):
        """esid's log lines: (level, text after the level)."""
        return [tuple(parts[2:]) for parts in (
            line.split(" ", 3) for line in self.esid.stderr().splitlines())
            if len(parts) == 4]

    def hup_lines(self):
        """esid's lines about SIGHUP."""
        return [l for l in self.esid_lines() if l[1].startswith("SIGHUP: ")]

    def reload(self, expected):
        """SIGHUP; esid's new SIGHUP lines are exactly `expected` (waited
        for, bounded: esid logs them as it handles the signal)."""
        before = len(self.hup_lines())
        self.esid.signal(signal.SIGHUP)
        poll(lambda: len(self.hup_lines()) >= before + len(expected),
             bound=10.0)
        self.assertEqual(self.hup_lines()[before:], expected,
                         self.esid.stderr())

    def default_zone(self):
        """esictl plans: esid's default plan zone (plan_store's)."""
        r = self.esictl("plans", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return json.loads(r.stdout)["default"]


class ReloadTest(ReloadTestCase):
    LOCATIONS = """
        location /held/ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@;
            # unbuffered: the page's first half goes on to esid as it
            # arrives, while the origin holds the rest
            proxy_buffering off;
            esi on;
        }"""

    def test_a_reload_applies_the_new_settings_around_a_running_page(self):
        self.start_esid_with("log_level = warn\nplan_store = 1M\n"
                             "ring_size = 1M\n")
        # plans in the default zone (location / plans without a zone of
        # its own), more than the new size will hold
        for i in range(40):
            self.origin.route("/p%d" % i, PAGE)
            for _ in range(2):                  # the miss, the recording hit
                self.assertBody("/p%d" % i, ASSEMBLED)
        zone = self.default_zone()
        self.assertEqual((zone["max_bytes"], zone["entries"],
                          zone["evictions"]), (MB, 40, 0), zone)
        self.assertGreater(zone["bytes"], 64 * 1024, zone)
        stats = self.stats_json()
        self.assertEqual((stats["connections"], stats["ring_capacity"]),
                         (1, 2 * MB), stats)
        # at warn: not even the line saying esid listens, nor the
        # worker's attaching
        self.assertEqual(self.esid_lines(), [])

        # a page whose body stops after its first include, until released
        first, rest = 'a<esi:include src="/esi/x?held"/>b', \
            '<esi:include src="/esi/y"/>c'
        self.origin.route("/held/page", first + rest)
        resume = self.origin.pause("/held/page", len(first))
        result = []
        client = threading.Thread(
            target=lambda: result.append(self.fetch("/held/page")),
            daemon=True)
        client.start()
        try:
            # esid has parsed the first half: the worker asked for its
            # include; the page's stream is open
            self.assertTrue(self.origin.wait_for_hits("/esi/x?held"))
            self.assertEqual(self.stats_json()["active_streams"], 1)

            self.write_settings("log_level = info\nplan_store = 64K\n"
                                "ring_size = 256K\n")
            self.reload([
                ("info", "SIGHUP: %s re-read" % self.conf),
                ("info", "SIGHUP: ring_size: 1048576 -> 262144"),
                ("info", "SIGHUP: plan_store: 1048576 -> 65536"),
                ("info", "SIGHUP: log_level: warn -> info"),
                ("info", "SIGHUP: the new ring size applies to workers "
                         "that connect from now on")])
            # plan_store at once: the zone evicted down to its new size
            # before any other page came
            zone = self.default_zone()
            self.assertEqual(zone["max_bytes"], 64 * 1024, zone)
            self.assertLessEqual(zone["bytes"], 64 * 1024, zone)
            self.assertGreater(zone["evictions"], 0, zone)
            self.assertEqual(zone["entries"] + zone["evictions"], 40, zone)
            self.assertEqual(self.stats_json()["active_streams"], 1)
        finally:
            resume.set()
            client.join(60)
        self.assertFalse(client.is_alive(), "the held page hung")
        r = result[0]
        # the page's second half was parsed after the reload, by the same
        # stream on the same connection
        self.assertEqual((r.status, r.complete, r.body), (200, True, b"aXbYc"))
        self.assertEqual(self.esi_status(81), "processed")
        # the stream's end reaches esid once the worker has ended it
        self.assertTrue(poll(lambda: self.stats_json()["active_streams"]
                             == 0), "the held page's stream stays open")
        stats = self.stats_json()
        self.assertEqual((stats["connections"], stats["active_connections"],
                          stats["ring_capacity"]), (1, 1, 2 * MB), stats)

        # ring_size for new workers: the worker's replacement gets 256K
        [worker] = self.worker_pids()
        self.kill_worker(worker)
        self.assertBody("/p0", ASSEMBLED)
        self.assertTrue(poll(lambda: self.stats_json()["connections"] == 2),
                        self.stats_json())
        stats = self.stats_json()
        self.assertEqual((stats["active_connections"],
                          stats["ring_capacity"]), (1, 2 * 256 * 1024), stats)
        # log_level info: the new worker's attaching is logged
        self.assertEqual([l for l in self.esid_lines()
                          if l not in self.hup_lines()],
                         [("info", "worker attached")])


class BadReloadTest(ReloadTestCase):

    def start_esid_with(self, text, *flags):
        """esid started, and a page planned in its default zone."""
        super().start_esid_with(text, *flags)
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        for _ in range(2):                      # the miss, the recording hit
            self.assertBody("/page", b"aXc")

    def assertKept(self):
        """The plan store esid started with, and pages still processed on
        the worker's one connection."""
        self.assertEqual(self.default_zone()["max_bytes"], MB)
        self.assertBody("/page", b"aXc")
        self.assertEqual(self.stats_json()["connections"], 1)

    def test_a_file_that_does_not_parse_changes_nothing(self):
        self.start_esid_with("log_level = info\nplan_store = 1M\n")
        # a good line before the bad one: nothing of the file applies
        self.write_settings("plan_store = 128K\nlog_level = loud\n")
        self.reload([
            ("error", 'SIGHUP: %s:2: log level "loud" is not one of trace, '
                      'debug, info, warn, error, critical, off; keeping the '
                      'current settings' % self.conf)])
        self.assertKept()
        os.unlink(self.conf)
        self.reload([
            ("error", "SIGHUP: cannot read %s: No such file or directory; "
                      "keeping the current settings" % self.conf)])
        self.assertKept()
        # what a good file changes is measured from the settings kept
        self.write_settings("log_level = info\nplan_store = 128K\n")
        self.reload([
            ("info", "SIGHUP: %s re-read" % self.conf),
            ("info", "SIGHUP: plan_store: 1048576 -> 131072")])
        self.assertEqual(self.default_zone()["max_bytes"], 128 * 1024)

    def test_what_waits_for_a_restart_is_kept_and_said(self):
        self.start_esid_with("plan_store = 1M\nsegment_arena = 2M\n"
                             "fleet_password = a\n")
        self.write_settings("plan_store = 128K\nsegment_arena = 4M\n"
                            "fleet_password = b\n")
        self.reload([
            ("warning", "SIGHUP: segment_arena changes only when esid "
                        "restarts; still 2097152"),
            ("warning", "SIGHUP: fleet_password changes only when esid "
                        "restarts; still (set)"),
            ("info", "SIGHUP: %s re-read" % self.conf),
            ("info", "SIGHUP: plan_store: 1048576 -> 131072")])
        self.assertEqual(self.default_zone()["max_bytes"], 128 * 1024)
        # the kept values are what the next reload is measured from
        self.reload([("warning", "SIGHUP: segment_arena changes only when "
                                 "esid restarts; still 2097152"),
                     ("warning", "SIGHUP: fleet_password changes only when "
                                 "esid restarts; still (set)"),
                     ("info", "SIGHUP: %s re-read, nothing changed"
                      % self.conf)])

    def test_the_command_line_still_overrides_the_file(self):
        self.start_esid_with("plan_store = 2M\n", "--plan-store", "1M")
        self.write_settings("plan_store = 128K\n")
        self.reload([("info", "SIGHUP: %s re-read, nothing changed"
                      % self.conf)])
        self.assertKept()


if __name__ == "__main__":
    unittest.main()
