"""The fleet over TLS (rediss://, issue 36): Debian's redis-server on a TLS
port only (`--port 0 --tls-port`, `tls-auth-clients yes`) with the
certificates this test makes with openssl: a CA, Redis' certificate (for
the name redis.test only), a client certificate, an expired one, another
CA.  Nodes with a client certificate and fleet_tls_server_name purge each
other; a wrong CA, an expired certificate, one for another name, no client
certificate, a plain-text Redis on a rediss:// URL and a TLS one on a
redis:// URL each leave purges `pending`, give one warning naming the
reason, and are retried, esid alive."""

import os
import re
import shutil
import subprocess
import unittest

from harness import ESID, EsiTestCase, free_port, poll
from test_fleet import (PURGE_HERE, REDIS, REDIS_CLI, FleetTestCase,
                        redis_answers)

OPENSSL = shutil.which("openssl")
SERVER_NAME = "redis.test"


class Certificates:
    """Keys and certificates made with openssl in a directory of the
    test's: files NAME.crt and NAME.key."""

    def __init__(self, directory):
        self.dir = directory
        os.mkdir(directory)

    def crt(self, name):
        return os.path.join(self.dir, name + ".crt")

    def key(self, name):
        return os.path.join(self.dir, name + ".key")

    def openssl(self, *argv):
        r = subprocess.run([OPENSSL] + list(argv), capture_output=True,
                           timeout=60, cwd=self.dir)
        if r.returncode != 0:
            raise AssertionError("openssl %s: %s" % (argv[0],
                                                     r.stderr.decode()))

    def new_key(self, name):
        return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", self.key(name)]

    def authority(self, name):
        self.openssl("req", "-x509", *self.new_key(name), "-out",
                     self.crt(name), "-subj", "/CN=esi test " + name,
                     "-days", "2")

    def sign(self, name, ca, usage, names=None, days=2):
        """A certificate for name signed by ca; days -1: expired."""
        csr = os.path.join(self.dir, name + ".csr")
        self.openssl("req", *self.new_key(name), "-out", csr,
                     "-subj", "/CN=" + name)
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("extendedKeyUsage = %s\n" % usage)
            if names:
                f.write("subjectAltName = %s\n" % names)
        self.openssl("x509", "-req", "-in", csr, "-CA", self.crt(ca),
                     "-CAkey", self.key(ca), "-CAcreateserial", "-out",
                     self.crt(name), "-days", str(days), "-extfile", ext)


class TlsRedis:
    """A test's TLS world: the certificates and redis-servers on a TLS
    port only, each started with the server certificate given."""

    def __init__(self, test):
        self.test = test
        self.certs = Certificates(os.path.join(test.tmp, "certs"))
        self.certs.authority("ca")
        self.certs.authority("other-ca")
        self.certs.sign("server", "ca", "serverAuth", "DNS:" + SERVER_NAME)
        self.certs.sign("client", "ca", "clientAuth")

    def client_args(self):
        return ["--tls", "--cacert", self.certs.crt("ca"),
                "--cert", self.certs.crt("client"),
                "--key", self.certs.key("client"), "--sni", SERVER_NAME]

    def answers(self, port):
        r = subprocess.run([REDIS_CLI, "-p", str(port), "--insecure"] +
                           self.client_args() + ["PING"],
                           capture_output=True, timeout=30)
        return r.stdout.startswith(b"PONG")

    def start(self, server="server", port=None):
        """A redis-server on a TLS port (port, or a free one): (port,
        process)."""
        port = port or free_port()
        directory = os.path.join(self.test.tmp, "redis-%s-%d" % (server, port))
        os.makedirs(directory, exist_ok=True)
        proc = self.test.spawn("redis-tls-" + server, [
            REDIS, "--port", "0", "--tls-port", str(port),
            "--bind", "127.0.0.1", "--dir", directory, "--save", "",
            "--appendonly", "yes",
            "--tls-cert-file", self.certs.crt(server),
            "--tls-key-file", self.certs.key(server),
            "--tls-ca-cert-file", self.certs.crt("ca"),
            "--tls-auth-clients", "yes", "--daemonize", "no"])
        if not poll(lambda: not proc.alive() or self.answers(port)) \
                or not proc.alive():
            self.test.fail("redis-server with TLS did not start:\n%s"
                           % proc.stderr())
        return port, proc

    def settings(self, port, ca="ca", client=True, server_name=SERVER_NAME):
        text = "fleet = rediss://127.0.0.1:%d/0\n" % port
        text += "fleet_tls_ca_file = %s\n" % self.certs.crt(ca)
        if client:
            text += "fleet_tls_cert_file = %s\nfleet_tls_key_file = %s\n" % (
                self.certs.crt("client"), self.certs.key("client"))
        if server_name:
            text += "fleet_tls_server_name = %s\n" % server_name
        return text


@unittest.skipIf(OPENSSL is None, "openssl not installed")
class FleetTlsTest(FleetTestCase):
    NODES = ("a", "b")

    def start_redis(self):
        self.tls = TlsRedis(self)
        self.redis_port, self.redis = self.tls.start()

    def fleet_settings(self):
        return self.tls.settings(self.redis_port)

    def redis_cli_connection(self):
        return ["-p", str(self.redis_port)] + self.tls.client_args()

    def test_a_purge_reaches_every_node_over_tls(self):
        self.cache_everywhere("/t", "/keep")
        a, b = self.fleet["a"], self.fleet["b"]
        r = self.purge(a, "/t")
        self.assertEqual(r.header("Cache-Purge-Fleet"), "published")
        self.await_files(b, 1)
        self.assertMiss(b, "/t")
        self.assertIn("fleet writer: connected to rediss://127.0.0.1:%d/0 "
                      "over TLS" % self.redis_port, a.esid.stderr())
        self.assertEqual(self.redis_cli("XLEN", "esi:purges"), "1")
        r = a.esictl("fleet")
        self.assertIn("node a on esi:purges of rediss://127.0.0.1:%d/0 (TLS): "
                      "connected" % self.redis_port, r.stdout.decode())

    def test_a_read_of_many_tls_records_is_taken_whole(self):
        # b, back, reads the ten entries it missed in one XREAD: some
        # 60 KB, several TLS records and socket reads
        b = self.fleet["b"]
        b.esid.stop()
        keys = ["/%d" % i + "k" * 6000 for i in range(10)]
        for key in keys:
            r = self.fleet["a"].esictl("purge", "pages", key)
            self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.start_fleet_esid(b)
        self.assertTrue(poll(lambda: self.fleet_stats(b)["fleet_applied"]
                             == 10), b.esid.stderr())
        self.assertEqual(self.fleet_stats(b)["fleet_skipped"], 0)

    def test_purges_made_while_redis_was_down_go_out_over_tls(self):
        self.cache_everywhere("/d", "/keep")
        a, b = self.fleet["a"], self.fleet["b"]
        self.redis.stop()
        self.assertTrue(poll(lambda: self.fleet_stats(a)["fleet_connected"]
                             == 0))
        r = self.purge(a, "/d")
        self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        self.redis = self.tls.start(port=self.redis_port)[1]
        self.await_files(b, 1)
        self.assertMiss(b, "/d")
        self.assertEqual(self.fleet_stats(a)["fleet_published"], 1)


@unittest.skipIf(REDIS is None or REDIS_CLI is None or OPENSSL is None,
                 "redis-server or openssl not installed")
class FleetTlsFaultTest(EsiTestCase):
    """Each way a TLS connection to Redis goes wrong: purges answered
    `pending` and kept, one warning that says why, retries, esid alive."""
    LOCATION = PURGE_HERE
    ESID = False

    def setUp(self):
        super().setUp()
        self.tls = TlsRedis(self)

    def start_fleet_esid(self, settings):
        conf = os.path.join(self.tmp, "esid.conf")
        with open(conf, "w") as f:
            f.write(settings + "fleet_node = n\nstate_dir = %s\n" % self.tmp)
        self.start_esid("--config", conf)

    def assertRefused(self, why):
        """Purges wait, the writer says why once, and tries again."""
        self.origin.route("/p", "p")
        self.assertEqual(self.get("/p")[1].get("X-Cache-Status"), "MISS")
        r = self.fetch("/p", method="PURGE")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.header("Cache-Purge-Fleet"), "pending")
        retried = re.compile(r"fleet writer: [^\n]*%s[^\n]*; next attempt in"
                             % re.escape(why))
        self.assertTrue(poll(lambda: retried.search(self.esid.stderr())),
                        "no retry failing with %r:\n%s" % (why,
                                                           self.esid.stderr()))
        warnings = [line for line in self.esid.stderr().splitlines()
                    if " warning fleet writer: " in line]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn(why, warnings[0])
        self.assertEqual(self.stats_json()["fleet_connected"], 0)
        self.assertTrue(self.esid.alive())

    def test_a_certificate_from_another_ca(self):
        self.start_fleet_esid(self.tls.settings(self.tls.start()[0],
                                                ca="other-ca"))
        self.assertRefused("(not signed by a CA of fleet_tls_ca_file)")

    def test_an_expired_certificate(self):
        self.tls.certs.sign("expired", "ca", "serverAuth",
                            "DNS:" + SERVER_NAME, days=-1)
        self.start_fleet_esid(self.tls.settings(self.tls.start("expired")[0]))
        self.assertRefused("TLS: Redis' certificate is refused: certificate "
                           "has expired")

    def test_a_certificate_for_another_name(self):
        # without fleet_tls_server_name the URL's 127.0.0.1 is checked
        self.start_fleet_esid(self.tls.settings(self.tls.start()[0],
                                                server_name=None))
        self.assertRefused("TLS: Redis' certificate is refused: IP address "
                           "mismatch")

    def test_no_client_certificate_where_redis_asks_for_one(self):
        self.start_fleet_esid(self.tls.settings(self.tls.start()[0],
                                                client=False))
        self.assertRefused("TLS: tlsv13 alert certificate required")

    def test_a_plain_text_redis_on_a_tls_url(self):
        port = free_port()
        self.spawn("redis-plain", [REDIS, "--port", str(port), "--bind",
                                   "127.0.0.1", "--save", "", "--dir",
                                   self.tmp, "--daemonize", "no"])
        self.assertTrue(poll(lambda: redis_answers(port)))
        self.start_fleet_esid(self.tls.settings(port))
        self.assertRefused("no TLS handshake within 2000 ms: a plain-text "
                           "Redis there? then redis:// in fleet")

    def test_a_tls_redis_on_a_plain_url(self):
        port, _ = self.tls.start()
        self.start_fleet_esid("fleet = redis://127.0.0.1:%d/0\n" % port)
        self.assertRefused("before answering a command: if that port speaks "
                           "TLS, write rediss:// in fleet")

    def test_tls_settings_that_cannot_be_used_stop_esid(self):
        conf = os.path.join(self.tmp, "esid.conf")

        def run(settings):
            with open(conf, "w") as f:
                f.write(settings + "fleet_node = n\nstate_dir = %s\n"
                        % self.tmp)
            r = subprocess.run([ESID, "--socket", self.socket_path,
                                "--config", conf], capture_output=True,
                               timeout=30, stdin=subprocess.DEVNULL)
            return r.returncode, r.stderr.decode()

        certs = self.tls.certs
        code, err = run("fleet = rediss://127.0.0.1:1/0\n"
                        "fleet_tls_cert_file = %s\n" % certs.crt("client"))
        self.assertEqual(code, 1, err)
        self.assertIn("fleet_tls_cert_file and fleet_tls_key_file go "
                      "together", err)
        code, err = run("fleet = rediss://127.0.0.1:1/0\n"
                        "fleet_tls_cert_file = %s\nfleet_tls_key_file = %s\n"
                        % (certs.crt("client"), certs.key("server")))
        self.assertEqual(code, 1, err)
        self.assertIn("critical fleet_tls_key_file %s cannot be used: key "
                      "values mismatch" % certs.key("server"), err)
        code, err = run("fleet = redis://127.0.0.1:1/0\n"
                        "fleet_tls_ca_file = %s\n" % certs.crt("ca"))
        self.assertEqual(code, 2, err)
        self.assertIn("write rediss:// for TLS", err)


if __name__ == "__main__":
    unittest.main()
