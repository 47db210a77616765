"""esid's Prometheus endpoint (--metrics ADDRESS:PORT): a live esid behind
real nginx is scraped before and after real pages and purges, the page is
read by prometheus_client's own parser (python3-prometheus-client), and
every counter must have moved by exactly what was done.  `esictl stats
--prometheus` prints the same page, fetched over the control socket."""

import http.client
import json
import os
import re
import subprocess
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    # Debian's python3-prometheus-client (packaging/deps.sh), pure Python,
    # for a python3 that is not Debian's own (a pyenv one on PATH).
    sys.path.append("/usr/lib/python3/dist-packages")
    from prometheus_client.parser import text_string_to_metric_families

from harness import ESID, SOURCE_DIR, EsiTestCase, free_port, poll

DASHBOARD = os.path.join(SOURCE_DIR, "packaging", "grafana", "esid-dashboard.json")

# Plans on, and the cached location purged by PURGE, keyed by $uri.
LOCATION = """
            esi_plan plans;
            proxy_cache_key $uri$is_args$args;
            esi_cache_purge PURGE from 127.0.0.1;
"""


def samples(text):
    """{(sample name, ((label, value), ...)): value} as Prometheus reads it;
    also checks that every family is declared once, with a type."""
    out = {}
    families = set()
    for family in text_string_to_metric_families(text):
        assert family.name not in families, family.name
        assert family.type in ("counter", "gauge", "histogram"), family
        families.add(family.name)
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class MetricsTest(EsiTestCase):
    HTTP = "esi_plan_zone plans:1m;"
    LOCATION = LOCATION

    def setUp(self):
        super().setUp()
        self.metrics_port = free_port()
        self.start_esid("--metrics", "127.0.0.1:%d" % self.metrics_port)
        self.origin.route("/esi/a", "A", content_type="text/plain")
        self.origin.route("/p", 'x<esi:include src="/esi/a"/>y')

    def scrape(self, path="/metrics"):
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port,
                                          timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type"), r.read().decode()
        finally:
            conn.close()

    def metrics(self):
        status, content_type, text = self.scrape()
        self.assertEqual(status, 200)
        self.assertEqual(content_type, "text/plain; version=0.0.4; charset=utf-8")
        return samples(text)

    def moved(self, before, after, name, **labels):
        key = (name, tuple(sorted(labels.items())))
        self.assertIn(key, after, "no sample %s%r" % (name, labels))
        return after[key] - before.get(key, 0)

    def hit(self, path, cache_status):
        status, headers, body = self.get(path)
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("X-Cache-Status"), cache_status)
        return body

    def test_pages_and_plans_move_their_counters_by_what_was_served(self):
        self.start()
        before = self.metrics()
        self.assertEqual(self.hit("/p", "MISS"), b"xAy")  # parsed, no plan lookup
        self.assertEqual(self.hit("/p", "HIT"), b"xAy")   # no plan yet: parsed, recorded
        self.assertEqual(self.hit("/p", "HIT"), b"xAy")   # the plan
        self.assertEqual(self.hit("/p", "HIT"), b"xAy")   # the plan, or the worker's copy
        after = self.metrics()
        self.assertEqual(self.moved(before, after, "esid_pages_total", how="parse"), 2)
        self.assertEqual(self.moved(before, after, "esid_pages_total", how="plan") +
                         self.moved(before, after, "esid_pages_total", how="replay"), 2)
        self.assertEqual(self.moved(before, after, "esid_plan_lookups_total",
                                    result="hit"), 2)
        self.assertEqual(self.moved(before, after, "esid_plan_lookups_total",
                                    result="miss"), 1)
        self.assertEqual(self.moved(before, after, "esid_plan_lookups_total",
                                    result="drop"), 0)
        self.assertEqual(self.moved(before, after, "esid_fragments_total",
                                    outcome="resolved"), 2)
        self.assertEqual(self.moved(before, after, "esid_fragments_total",
                                    outcome="refused"), 0)
        self.assertEqual(self.moved(before, after, "esid_includes_total"), 2)
        for cause in ("protocol", "include_refused", "purge", "scan"):
            self.assertEqual(after[("esid_errors_total", (("cause", cause),))], 0, cause)
        self.assertEqual(after[("esid_sessions", ())], 1)
        self.assertEqual(after[("esid_ring_capacity_bytes", ())], 2 * 1024 * 1024)
        self.assertIn(("esid_ring_used_bytes", (("ring", "requests"),)), after)
        # esictl stats says the same, by key: the one source of both.
        stats = self.stats_json()
        self.assertEqual(stats["ring_capacity"], 2 * 1024 * 1024)
        self.assertEqual(stats["ring_used_requests"], 0)   # nothing in flight
        self.assertEqual(stats["ring_used_responses"], 0)

    def test_purges_count_by_kind_and_feed_the_latency_histogram(self):
        for path in ("/x", "/w/1", "/w/2"):
            self.origin.route(path, path)
            self.hit(path, "MISS")
        # The zone's first scan is over (its histogram has it) before the
        # purges, so that each is answered as it will be from now on.
        self.assertTrue(poll(lambda: self.metrics().get(
            ("esid_scan_duration_seconds_count", ()), 0) >= 1))
        before = self.metrics()
        r = self.fetch("/x", method="PURGE")
        self.assertEqual(r.status, 200, r.body)
        r = self.esictl("purge", "pages", "/w/", "--prefix")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b"2 file(s) removed", r.stdout)
        after = self.metrics()

        def purges(kind):
            return sum(self.moved(before, after, "esid_purges_total", kind=kind,
                                  mode="hard", path=path)
                       for path in ("index", "directory"))
        self.assertEqual(purges("exact"), 1)
        self.assertEqual(purges("wildcard"), 1)
        self.assertEqual(purges("tag"), 0)
        self.assertEqual(self.moved(before, after, "esid_purges_total", kind="exact",
                                    mode="hard", path="index"), 1)
        self.assertEqual(self.moved(before, after, "esid_purge_duration_seconds_count"), 2)
        self.assertEqual(self.moved(before, after, "esid_purge_duration_seconds_bucket",
                                    le="+Inf"), 2)
        self.assertGreater(self.moved(before, after, "esid_purge_duration_seconds_sum"), 0)
        # Buckets are cumulative: each bound holds at least the one below.
        bounds = sorted((float(dict(k[1])["le"]), v) for k, v in after.items()
                        if k[0] == "esid_purge_duration_seconds_bucket")
        self.assertEqual([v for _, v in bounds], sorted(v for _, v in bounds))

    def test_esictl_prints_the_same_page(self):
        self.start()
        self.hit("/p", "MISS")
        _, _, scraped = self.scrape()
        r = self.esictl("stats", "--prometheus")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        printed = samples(r.stdout.decode())
        endpoint = samples(scraped)
        self.assertEqual(set(printed), set(endpoint))
        for key in (("esid_pages_total", (("how", "parse"),)),
                    ("esid_streams_total", ()), ("esid_includes_total", ())):
            self.assertEqual(printed[key], endpoint[key], key)
            self.assertEqual(printed[key], 1, key)

    def test_the_grafana_dashboard_asks_for_names_esid_serves(self):
        """Grafana is not in Debian: the dashboard's queries are checked
        against the live page's names, not rendered."""
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        asked = set(re.findall(r"esid_[a-z_]+", " ".join(exprs)))
        self.start()
        served = {name for name, _ in self.metrics()}
        # The fleet's appear only with a fleet.
        missing = {n for n in asked - served if not n.startswith("esid_fleet_")}
        self.assertEqual(missing, set())
        self.assertIn("esid_purge_duration_seconds_bucket", asked)

    def test_other_paths_and_methods_are_refused(self):
        self.assertEqual(self.scrape("/")[0], 404)
        self.assertEqual(self.scrape("/metrics/x")[0], 404)
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        conn.request("POST", "/metrics", body=b"x")
        self.assertEqual(conn.getresponse().status, 405)
        conn.close()
        # A scrape still works afterwards.
        self.assertEqual(self.scrape()[0], 200)


class MetricsOffTest(EsiTestCase):
    """Without --metrics esid listens on no TCP port."""

    def test_no_metrics_port_by_default(self):
        self.start()
        pid = self.esid.pid
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                listening += [l for l in f.read().splitlines()[1:]
                              if l.split()[3] == "0A"]
        inodes = {l.split()[9] for l in listening}
        fds = os.listdir("/proc/%d/fd" % pid)
        sockets = {os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in fds}
        self.assertFalse({"socket:[%s]" % i for i in inodes} & sockets)

    def test_a_bad_address_is_refused_with_its_reason(self):
        r = subprocess.run([ESID, "--socket", os.path.join(self.tmp, "s"),
                            "--metrics", "localhost:9145"],
                           capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"not a numeric IPv4 address", r.stderr)
