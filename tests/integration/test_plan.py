"""Parse plans (esi_plan): the first cache hit records where the page's
constructs are, later hits replay it without sending esid a byte of the
page; a plan that does not match the body it meets is dropped where it
stops matching and the rest is parsed, so the response is always right."""

import glob
import os
import re
import unittest

from harness import EsiTestCase, poll

INCLUDES = ['<esi:include src="/esi/a"/>', '<esi:include src="/esi/b"/>',
            '<esi:remove>gone</esi:remove>', '<!--esi <b>kept</b> -->',
            '<esi:include src="/esi/c" onerror="continue"/>']


def page(filler=40):
    """Text, then each construct, then text."""
    text = "".join("<p>para %d %s</p>\n" % (i, "x" * filler)
                   for i in range(3))
    return text + text.join(INCLUDES) + text


def assembled(body):
    return (body.replace(INCLUDES[0], "A").replace(INCLUDES[1], "B")
            .replace(INCLUDES[2], "").replace(INCLUDES[3], " <b>kept</b> ")
            .replace("<esi:remove>GONE</esi:remove>", "")
            .replace('<esi:include src="/esi/a" onerror="continue"/>', "A")
            .replace(INCLUDES[4], "C"))


class PlanTestCase(EsiTestCase):
    HTTP = "esi_plan_zone plans:1m;"
    LOCATION = "esi_plan plans;"

    def setUp(self):
        super().setUp()
        # plain text: fragments are not parsed, so esid's byte count is
        # the pages' alone
        for name in "abc":
            self.origin.route("/esi/" + name, name.upper(),
                              content_type="text/plain")

    def hit(self, path, expected, status="HIT"):
        code, headers, body = self.get(path)
        self.assertEqual(code, 200)
        self.assertEqual(headers.get("X-Cache-Status"), status)
        self.assertEqual(body, expected.encode())

    def counters(self):
        stats = self.stats_json()
        return stats["planned"], stats["bytes"]

    def cache_file(self):
        files = [f for f in glob.glob(os.path.join(self.tmp, "cache", "**"),
                                      recursive=True) if os.path.isfile(f)]
        self.assertEqual(len(files), 1, files)
        return files[0]

    def rewrite_cached_body(self, old, new):
        """The same object on disk (same file, size, header size and
        modification time) with other bytes: what no identity tells
        apart, so the plan's checks must.  Returns a function that puts
        the original back."""
        self.assertEqual(len(old), len(new))
        path = self.cache_file()
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data.count(old.encode()), 1)
        stat = os.stat(path)

        def write(content):
            with open(path, "r+b") as f:
                f.write(content)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

        write(data.replace(old.encode(), new.encode()))
        return lambda: write(data)


class PlanTest(PlanTestCase):

    def test_later_hits_replay_the_plan_without_sending_the_page(self):
        body = page()
        self.origin.route("/p", body)
        self.hit("/p", assembled(body), "MISS")
        self.hit("/p", assembled(body))          # parsed, plan recorded
        planned, parsed = self.counters()
        self.assertEqual(planned, 0)
        for _ in range(3):
            self.hit("/p", assembled(body))
        planned2, parsed2 = self.counters()
        self.assertEqual(planned2, 3)
        self.assertEqual(parsed2, parsed, "page bytes reached esid")

    def test_a_planned_hit_sends_esid_less_than_its_page(self):
        body = page(filler=2000)
        self.origin.route("/p", body)
        for status in ("MISS", "HIT", "HIT"):
            self.hit("/p", assembled(body), status)
        before = self.stats_json()["ring_bytes_in"]
        self.hit("/p", assembled(body))
        sent = self.stats_json()["ring_bytes_in"] - before
        self.assertGreater(sent, 0)
        self.assertLess(sent, 256, "bytes to esid for a %d byte page" %
                        len(body))

    def test_nothing_is_recorded_on_a_miss(self):
        body = page()
        self.origin.route("/p", body)
        self.hit("/p", assembled(body), "MISS")
        self.hit("/p", assembled(body))
        self.assertEqual(self.counters()[0], 0,
                         "the first hit was planned: the miss recorded")

    def test_a_page_without_esi_goes_out_as_it_is_once_its_plan_said_so(self):
        """Its plan is one run over the whole page: the worker that
        replayed it serves later hits as with esi off (the object as it
        is, with its Content-Length), without esid."""
        body = "<html><body>" + "<p>plain &lt; text</p>\n" * 500 + \
            "</body></html>"
        self.origin.route("/plain", body,
                          headers=[("Surrogate-Control", "max-age=60")])
        for status in ("MISS", "HIT", "HIT"):
            self.hit("/plain", body, status)
        before = self.stats_json()
        self.assertEqual(before["planned"], 1)
        for _ in range(3):
            code, headers, got = self.get("/plain")
            self.assertEqual(got, body.encode())
            self.assertEqual(headers.get("X-Cache-Status"), "HIT")
            self.assertEqual(headers.get("Content-Length"), str(len(body)))
            self.assertIsNone(headers.get("Surrogate-Control"))
        after = self.stats_json()
        self.assertEqual((after["planned"], after["streams"]),
                         (before["planned"], before["streams"]))
        self.assertEqual(self.esi_status(6), "processed")

    def test_large_page_replays_across_buffers(self):
        # 300 KB: read from the cache file in several buffers, constructs
        # and checks straddling their edges somewhere
        body = page(filler=20000)
        self.origin.route("/big", body)
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.hit("/big", assembled(body), status)
        self.assertEqual(self.counters()[0], 2)

    def test_gzipped_cached_page_replays(self):
        body = page()
        self.origin.route("/gz", body, gzip=True)
        for status in ("MISS", "HIT", "HIT"):
            self.hit("/gz", assembled(body), status)
        self.assertEqual(self.counters()[0], 1)

    def test_a_construct_that_differs_drops_the_plan_at_it(self):
        """Forced collision: same key, Date, size and header size, other
        bytes in each construct in turn; every response is the new page
        assembled, and the log says where the plan was dropped."""
        body = page()
        self.origin.route("/p", body)
        self.hit("/p", assembled(body), "MISS")
        original = body
        replacements = [
            (INCLUDES[0], '<esi:include src="/esi/b"/>'),
            (INCLUDES[1], '<esi:include src="/esi/a"/>'),
            (INCLUDES[2], '<esi:remove>GONE</esi:remove>'),
            (INCLUDES[3], '<!--ESI <b>kept</b> -->'),   # a plain comment
            (INCLUDES[4], '<esi:include src="/esi/a" onerror="continue"/>'),
        ]
        drops = 0
        for old, new in replacements:
            self.hit("/p", assembled(original))   # records
            self.hit("/p", assembled(original))   # replays
            restore = self.rewrite_cached_body(old, new)
            self.hit("/p", assembled(original.replace(old, new)))
            drops += 1
            at = original.index(old)
            self.assertTrue(poll(lambda: self.error_log().count(
                "plan dropped at byte ") >= drops))
            self.assertIn("plan dropped at byte %d: a construct differs"
                          % at, self.error_log())
            restore()

    def test_a_page_of_many_constructs_replays_and_drops_late(self):
        """More steps than the connector runs at a time: the replay goes
        on from one batch to the next, and a construct near the end that
        differs drops the plan there."""
        names = ["abc"[i % 3] for i in range(40)]
        body = "".join('<p>%d</p><esi:include src="/esi/%s"/>' % (i, n)
                       for i, n in enumerate(names)) + "<p>end</p>"
        expected = "".join("<p>%d</p>%s" % (i, n.upper())
                           for i, n in enumerate(names)) + "<p>end</p>"
        self.origin.route("/many", body)
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.hit("/many", expected, status)
        self.assertEqual(self.counters()[0], 2)
        old = '<p>39</p><esi:include src="/esi/a"/>'
        restore = self.rewrite_cached_body(
            old, '<p>39</p><esi:include src="/esi/b"/>')
        self.hit("/many", expected[:expected.index("<p>39</p>")] +
                 "<p>39</p>B<p>end</p>")
        at = body.index(old) + len("<p>39</p>")
        self.assertTrue(poll(lambda: "plan dropped at byte %d: a construct "
                             "differs" % at in self.error_log()))
        restore()


class PlanReuseTest(PlanTestCase):
    """A plan that reads nothing of the request is the same for every hit:
    the worker keeps esid's message and replays it to later hits of the
    object for esi_plan_reuse without asking; esid only hears of each
    hit."""
    LOCATION = "esi_plan plans; esi_plan_reuse 1h;"
    # the same objects (same cache keys), with esi_plan_reuse 0
    LOCATIONS = """
        location ~ ^/asking(/.*)$ {
            proxy_pass http://127.0.0.1:@@ORIGIN@@$1;
            proxy_cache pages;
            proxy_cache_key http://$proxy_host$1;
            add_header X-Cache-Status $upstream_cache_status;
            esi on;
            esi_plan plans;
            esi_plan_reuse 0;
        }
"""

    def test_later_hits_replay_the_workers_copy_without_asking_esid(self):
        body = page()
        self.origin.route("/p", body)
        for status in ("MISS", "HIT", "HIT"):   # parsed, then esid's plan
            self.hit("/p", assembled(body), status)
        before = self.stats_json()
        self.assertEqual((before["planned"], before["replayed"]), (1, 0))
        for _ in range(3):
            self.hit("/p", assembled(body))
        after = self.stats_json()
        self.assertEqual(after["replayed"], 3, "hits asked esid for the plan")
        self.assertEqual(after["planned"], 4)
        self.assertEqual(after["streams"], before["streams"])
        # what reached esid per hit: the report (with the page's path and
        # status, for esictl log), no open, no body
        self.assertLess((after["ring_bytes_in"] - before["ring_bytes_in"])
                        / 3, 136)

    def test_a_copy_serves_another_location_only_if_it_reuses_plans(self):
        # the same object through a location with esi_plan_reuse 0
        body = page()
        self.origin.route("/p", body)
        for status in ("MISS", "HIT", "HIT"):
            self.hit("/p", assembled(body), status)
        for _ in range(2):
            self.hit("/asking/p", assembled(body))
        self.assertEqual(self.stats_json()["replayed"], 0)
        self.hit("/p", assembled(body))
        self.assertEqual(self.stats_json()["replayed"], 1)

    def test_a_plan_that_reads_the_request_is_asked_for_on_every_hit(self):
        self.start()
        body = ('<esi:vars><p>$(HTTP_HOST)</p></esi:vars>' +
                INCLUDES[0] + '<esi:choose><esi:when test="$(HTTP_HOST)'
                '==\'b.test\'">b</esi:when><esi:otherwise>not b'
                '</esi:otherwise></esi:choose>')
        self.origin.route("/v", body)
        self.get("/v")                           # MISS
        self.get("/v")                           # records
        for host, chosen in (("a.test", "not b"), ("b.test", "b"),
                             ("c.test", "not b")):
            code, headers, got = self.get("/v", {"Host": host})
            self.assertEqual(headers.get("X-Cache-Status"), "HIT")
            self.assertEqual(got.decode(), "<p>%s</p>A%s" % (host, chosen))
        stats = self.stats_json()
        self.assertEqual((stats["planned"], stats["replayed"]), (3, 0))

    def test_a_copy_that_stops_matching_is_forgotten_with_the_plan(self):
        body = page()
        self.origin.route("/p", body)
        for status in ("MISS", "HIT", "HIT"):   # esid's plan, kept
            self.hit("/p", assembled(body), status)
        old, new = INCLUDES[0], '<esi:include src="/esi/b"/>'
        self.rewrite_cached_body(old, new)
        changed = assembled(body.replace(old, new))
        self.hit("/p", changed)                  # the copy, dropped
        self.assertEqual(self.stats_json()["replayed"], 1)
        self.hit("/p", changed)                  # parsed, plan recorded
        self.hit("/p", changed)                  # esid's new plan
        self.assertEqual(self.error_log().count("plan dropped at byte "), 1)
        self.assertEqual(self.stats_json()["replayed"], 1)


class PlanDropInContextTest(PlanTestCase):
    """A plan dropped inside <esi:vars> or <!--esi ... -->: the parse
    resumes in that context, so what follows reads as the page meant."""

    TEXT = "<p>%s</p>" % ("x" * 1500)     # longer than a span: checked alone

    def drop_at_the_include(self, path, body, expected, at=None):
        self.origin.route(path, body)
        for status in ("MISS", "HIT", "HIT"):
            self.hit(path, expected, status)
        self.assertEqual(self.counters()[0], 1)
        self.rewrite_cached_body('<esi:include src="/esi/a"/>',
                                 '<esi:include src="/esi/b"/>')
        self.hit(path, expected.replace(">A<", ">B<"))
        if at is None:
            at = body.index('<esi:include src="/esi/a"/>')
        self.assertTrue(poll(lambda: "plan dropped at byte %d: a construct "
                             "differs" % at in self.error_log()))

    def test_inside_vars_a_reference_after_the_drop_is_substituted(self):
        self.start()
        host = "127.0.0.1:%d" % self.port
        self.drop_at_the_include(
            "/vars",
            '<esi:vars>%s<esi:include src="/esi/a"/><p>$(HTTP_HOST)</p>'
            '</esi:vars><p>$(HTTP_HOST)</p>' % self.TEXT,
            "%sA<p>%s</p><p>$(HTTP_HOST)</p>" % (self.TEXT, host))

    def test_inside_vars_a_try_that_differs_is_parsed_in_vars(self):
        # dropped before the try (never inside it), where the parse resumes
        # inside the vars block: the try's values are substituted
        self.start()
        host = "127.0.0.1:%d" % self.port
        body = ('<esi:vars>%s<esi:try><esi:attempt><b>$(HTTP_HOST)</b>'
                '<esi:include src="/esi/a"/></esi:attempt><esi:except>E'
                '</esi:except></esi:try><i>$(HTTP_HOST)</i></esi:vars>'
                '$(HTTP_HOST)' % self.TEXT)
        self.drop_at_the_include(
            "/vars-try", body,
            "%s<b>%s</b>A<i>%s</i>$(HTTP_HOST)" % (self.TEXT, host, host),
            at=len("<esi:vars>") + len(self.TEXT))

    def test_inside_an_esi_comment_its_end_is_not_sent(self):
        self.drop_at_the_include(
            "/comment",
            '<!--esi %s<esi:include src="/esi/a"/><p>after</p> --><p>end</p>'
            % self.TEXT,
            " %sA<p>after</p> <p>end</p>" % self.TEXT)


class PlanTryTest(PlanTestCase):
    """A plan never stops matching inside <esi:try> (its attempt is held in
    the worker, esid could not take it over): the worker checks each try
    whole, from the check before it, before it runs any of it."""

    TEXT = "<p>%s</p>" % ("t" * 400)
    TRY = ('<esi:try><esi:attempt>' + TEXT + INCLUDES[0] + TEXT +
           INCLUDES[2] + TEXT + '</esi:attempt><esi:except>' + TEXT +
           INCLUDES[1] + '</esi:except></esi:try>')

    @staticmethod
    def tried(body):
        """The page assembled, its attempts succeeding."""
        return assembled(re.sub(
            r"</esi:attempt><esi:except>.*?</esi:except></esi:try>", "",
            body).replace("<esi:try><esi:attempt>", ""))

    def test_a_construct_that_differs_inside_a_try_drops_the_plan_before_it(
            self):
        body = self.TEXT + self.TRY + self.TEXT + INCLUDES[4] + self.TEXT
        self.origin.route("/p", body)
        self.hit("/p", self.tried(body), "MISS")
        start = body.index("<esi:try>")
        inside = [
            ("<esi:try><esi:attempt>", "<esi:try><esi:ATTEMPT>"),
            (INCLUDES[0], '<esi:include src="/esi/c"/>'),
            ("<esi:remove>gone</esi:remove>", "<esi:remove>GONE</esi:remove>"),
            ("</esi:attempt><esi:except>", "</esi:attempt><esi:EXCEPT>"),
            (INCLUDES[1], '<esi:include src="/esi/c"/>'),
            ("</esi:except></esi:try>", "</esi:except></esi:TRY>"),
        ]
        for n, (old, new) in enumerate(inside, 1):
            self.hit("/p", self.tried(body))   # records
            self.hit("/p", self.tried(body))   # replays
            restore = self.rewrite_cached_body(old, new)
            _, _, got = self.get("/p")
            self.assertEqual(got, self.parsed(body.replace(old, new)), old)
            self.assertTrue(poll(lambda: self.error_log().count(
                "plan dropped at byte %d: a construct differs" % start)
                == n), old)
            restore()
        self.assertNotIn("esi_fallback", self.error_log())

    def parsed(self, body):
        """The page as esid parses it, with the plan off."""
        self.origin.route("/parsed", body, headers=[("Cache-Control",
                                                     "no-store")])
        _, headers, got = self.get("/parsed")
        self.assertNotEqual(headers.get("X-Cache-Status"), "HIT")
        return got

    def test_tries_across_the_bodys_buffers_replay(self):
        # 300 KB of tries between runs: some tries straddle the buffers the
        # cache file is read in, so their check waits for the next one
        body = "".join("<p>%d %s</p>" % (i, "x" * 7000) + self.TRY
                       for i in range(40))
        self.origin.route("/big", body)
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.hit("/big", self.tried(body), status)
        self.assertEqual(self.counters()[0], 2)
        self.assertNotIn("plan dropped", self.error_log())

    def test_a_try_longer_than_the_bodys_buffers_is_checked_whole(self):
        # ~120 KB from the check before the try to its end: read in several
        # buffers, held as copies while the worker waits for the rest; a
        # construct that differs near its end drops the plan before the try
        long_try = self.TRY.replace(self.TEXT, self.TEXT * 60)
        body = self.TEXT + long_try + self.TEXT
        self.origin.route("/long", body)
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.hit("/long", self.tried(body), status)
        self.assertEqual(self.counters()[0], 2)
        old = '</esi:attempt><esi:except>'
        new = '</esi:attempt><esi:EXCEPT>'
        restore = self.rewrite_cached_body(old, new)
        _, _, got = self.get("/long")
        self.assertEqual(got, self.parsed(body.replace(old, new)))
        self.assertTrue(poll(lambda: "plan dropped at byte %d: a construct "
                             "differs" % len(self.TEXT) in self.error_log()))
        restore()


class TinyZoneTest(PlanTestCase):
    """A zone too small for every plan keeps the most recently used."""
    HTTP = "esi_plan_zone plans:64k;"

    def test_plans_are_evicted_and_responses_stay_right(self):
        # each plan holds ~40 includes and checks: a few KB
        include = '<esi:include src="/esi/a"/>'
        bodies = {}
        for i in range(40):
            bodies["/e%d" % i] = ("<p>%d</p>" % i) + \
                ("<b>x</b>" + include) * 40
            self.origin.route("/e%d" % i, bodies["/e%d" % i])
        for path, body in bodies.items():
            want = body.replace(include, "A")
            self.hit(path, want, "MISS")
            self.hit(path, want)      # records, evicting older plans
            self.hit(path, want)      # replays
        r = self.esictl("plans", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        import json
        zone = json.loads(r.stdout)["plans"]
        self.assertGreater(zone["evictions"], 0)
        self.assertLessEqual(zone["bytes"], 64 * 1024)
        self.assertLess(zone["entries"], 40)
        self.assertEqual(self.counters()[0], 40)


if __name__ == "__main__":
    unittest.main()
