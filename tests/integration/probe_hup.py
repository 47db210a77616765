import os, json
from harness import EsiTestCase
class P(EsiTestCase):
    ESID_ARGS = ()
    def test_probe(self):
        conf = os.path.join(self.tmp, "esid.conf")
        open(conf, "w").write("log_level = info\nplan_store = 1M\n")
        self.start_esid("--config", conf)
        self.origin.route("/page", 'a<esi:include src="/esi/x"/>c')
        self.origin.route("/esi/x", "X")
        for _ in range(3): print(self.get("/page")[2])
        print(json.dumps(self.stats_json(), indent=0))
        r = self.esictl("plans", "--json"); print(r.stdout.decode())
        r = self.esictl("plans"); print(r.stdout.decode())
        print(self.esid.stderr())
