"""The minimal configuration is the fast one: `esi on` in a location that
caches records and replays plans in esid's default plan zone (sized by
esid's plan_store) and, where gzip is on, stitches gzip clients' answers
from stored segments; `esi_plan off` and `esi_stitch off` opt out."""

import json

from harness import EsiTestCase
from test_stitch import GZIP, assembled, gunzip, page, runs_of, segment

PLAN_STORE = 1 << 20


class DefaultsTestCase(EsiTestCase):
    ESID_ARGS = EsiTestCase.ESID_ARGS + ("--plan-store", "1M")

    def setUp(self):
        super().setUp()
        self.origin.route("/esi/a", "A", content_type="text/plain")
        self.origin.route("/esi/b", "B", content_type="text/plain")
        self.body = page(runs_of("d"))
        self.origin.route("/d", self.body)

    def answer(self, status, headers=None):
        code, hdrs, body = self.get("/d", headers)
        self.assertEqual(code, 200)
        self.assertEqual(hdrs.get("X-Cache-Status"), status)
        if hdrs.get("Content-Encoding") == "gzip":
            body = gunzip(body)
        self.assertEqual(body, assembled(self.body).encode())
        return hdrs.get("Content-Encoding"), body

    def plan_zones(self):
        r = self.esictl("plans", "--json")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return json.loads(r.stdout)


class DefaultPlansTest(DefaultsTestCase):

    def test_esi_on_in_a_cached_location_replays_plans(self):
        for status in ("MISS", "HIT", "HIT", "HIT"):
            self.answer(status)
        self.assertEqual(self.stats_json()["planned"], 2)
        zone = self.plan_zones()["default"]
        self.assertEqual(zone["max_bytes"], PLAN_STORE)
        self.assertEqual((zone["entries"], zone["recorded"]), (1, 1))

    def test_gzip_off_answers_gzip_clients_plainly(self):
        for status in ("MISS", "HIT", "HIT"):
            self.assertIsNone(self.answer(status, GZIP)[0])
        self.assertEqual(self.stats_json()["stitched"], 0)


class DefaultStitchTest(DefaultsTestCase):
    LOCATION = "gzip on;"

    def test_gzip_on_stitches_without_a_directive(self):
        self.answer("MISS", GZIP)
        self.answer("HIT", GZIP)                 # records plan and segments
        _, hdrs, raw = self.get("/d", GZIP)
        self.assertEqual(hdrs.get("Content-Encoding"), "gzip")
        self.assertEqual(gunzip(raw), assembled(self.body).encode())
        self.assertIn(segment(runs_of("d")[2]), raw)
        self.assertEqual(self.stats_json()["stitched"], 1)
        self.assertIsNone(self.answer("HIT")[0])  # a plain client, planned


class OptOutTest(DefaultsTestCase):

    def test_esi_plan_off_parses_every_hit(self):
        self.LOCATION = "esi_plan off;"
        for status in ("MISS", "HIT", "HIT"):
            self.answer(status)
        self.assertEqual(self.stats_json()["planned"], 0)
        self.assertNotIn("default", self.plan_zones())

    def test_esi_stitch_off_leaves_gzip_to_the_gzip_filter(self):
        self.LOCATION = "gzip on; esi_stitch off;"
        for status in ("MISS", "HIT", "HIT"):
            self.assertEqual(self.answer(status, GZIP)[0], "gzip")
        stats = self.stats_json()
        self.assertEqual((stats["planned"], stats["stitched"]), (1, 0))
