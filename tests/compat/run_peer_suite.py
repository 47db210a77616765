#!/usr/bin/env python3
"""Runs ngx_cache_purge 3.0's own Test::Nginx suite, as written, on our
module: the .t files come from the peer's release tarball (../shared/peers,
or ESI_PEERS_DIR), extracted at test time, and run with prove on
tests/compat/lib's Test::Nginx::Socket (Debian packages no Test::Nginx),
with only the module swapped: TEST_NGINX_LOAD_MODULES names ours, and an
esid beside it serves the esi_daemon socket that TEST_NGINX_HTTP_CONFIG
gives.

    python3 run_peer_suite.py

Each block is one entry of the gate (tests/README.md, "What the gate
counts"): with ESI_RESULTS_DIR set, PEER.results gets an "expect" line
with the number of blocks the files hold, read before they run, one
"pass" or "fail" line a block (prove's top-level TAP line of its
subtest), and an "end" line, as integration/run_counted.py writes them.
Exits 0 when every block passed, but for EXPECTED_FAILURES, which must
fail."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))

from esitest import (NGINX, SANITIZER_REPORT, DidNotStart,  # noqa: E402
                     Process, free_port, read_text, sanitizer_env,
                     start_on_socket)

NAME = "peer_ngx_cache_purge"
TARBALL = "ngx_cache_purge-3.0.1.tar.gz"
FILES = ("t/basic.t", "t/config.t", "t/background_queue.t")

SOURCE_DIR = os.environ.get("ESI_SOURCE_DIR", os.path.dirname(
    os.path.dirname(HERE)))
BUILD_DIR = os.environ.get("ESI_BUILD_DIR", os.path.join(SOURCE_DIR,
                                                         "build"))
PEERS = os.environ.get("ESI_PEERS_DIR", os.path.realpath(
    os.path.join(SOURCE_DIR, "..", "shared", "peers")))

TAP_LINE = re.compile(r"^(not )?ok \d+ - (.*)$")

# Blocks that assert what this module does otherwise, on purpose: counted
# as passed while they fail (an expectedFailure), and as failed should they
# pass, so that a change is seen.
EXPECTED_FAILURES = {
    # queue_size 1 and throttle_ms 1000ms hold the first purge in
    # ngx_cache_purge's queue for a second, so the second finds it full
    # and is done at once (412).  Here no purge waits: esid carries each
    # out off the event loop as it comes, so the second is answered as the
    # first, 202 (docs/purge.md, "Moving from ngx_cache_purge").
    "t/background_queue.t TEST 3: queue overflow — second wildcard purge "
    "falls back to 412",
}


def blocks(path):
    """The names of the blocks of a .t file, as Test::Base splits them:
    "=== NAME" lines after __DATA__."""
    with open(path) as f:
        data = f.read().split("\n__DATA__\n", 1)[-1]
    return re.findall(r"^=== (.*?)\s*$", data, re.M)


def main():
    tarball = os.path.join(PEERS, TARBALL)
    if not os.path.exists(tarball):
        sys.stderr.write("%s not found (ESI_PEERS_DIR names its folder)\n"
                         % tarball)
        return 1

    tmp = tempfile.mkdtemp(prefix="esi-peer-")
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp)
    root = os.path.join(tmp, TARBALL[:-len(".tar.gz")])

    results = os.environ.get("ESI_RESULTS_DIR")
    record = None
    if results:
        os.makedirs(results, exist_ok=True)
        record = open(os.path.join(results, NAME + ".results"), "w")
        expected = sum(len(blocks(os.path.join(root, f))) for f in FILES)
        record.write("expect\t%s\t%d\n" % (NAME, expected))
        record.flush()

    socket = os.path.join(tmp, "esid.sock")
    try:
        esid = start_on_socket(
            lambda name, argv: Process(name, argv, tmp), "esid",
            [os.path.join(BUILD_DIR, "esid"), "--socket", socket], socket)
    except DidNotStart as e:
        sys.stderr.write("esid did not start:\n%s\n" % e.log)
        return 1

    # ESI_MODULE=builtin: nginx has the module compiled in, as the
    # integration harness reads it
    module = os.environ.get("ESI_MODULE", os.path.join(
        BUILD_DIR, "ngx_http_esi_module.so"))
    # a sanitized nginx (tests/run.sh's second suite) writes its reports
    # to sanitizer.PID, as the integration harness has it
    sanitizer_log = os.path.join(tmp, "sanitizer")
    env = dict(sanitizer_env(sanitizer_log, os.path.join(
                   os.path.dirname(HERE), "sanitize")),
               TEST_NGINX_BINARY=NGINX,
               TEST_NGINX_PORT=str(free_port()),
               TEST_NGINX_LOAD_MODULES="" if module == "builtin" else module,
               TEST_NGINX_HTTP_CONFIG="esi_daemon unix:%s;" % socket)
    env.pop("TEST_NGINX_SERVROOT", None)

    ran = 0
    ok = True
    try:
        for name in FILES:
            prove = subprocess.run(
                ["prove", "-v", "--merge", "-I", os.path.join(HERE, "lib"), name],
                cwd=root, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, universal_newlines=True)
            sys.stdout.write(prove.stdout)
            outcomes = [(m.group(1) is None, "%s %s" % (name, m.group(2)))
                        for m in map(TAP_LINE.match,
                                     prove.stdout.splitlines()) if m]
            if len(outcomes) != len(blocks(os.path.join(root, name))):
                ok = False      # the file stopped early
            for passed, test in outcomes:
                expected = test in EXPECTED_FAILURES
                outcome = {(True, False): "pass", (False, False): "fail",
                           (False, True): "xfail",
                           (True, True): "xpass"}[passed, expected]
                ok = ok and outcome in ("pass", "xfail")
                print("%s: %s" % (outcome, test))
                if record:
                    record.write("%s\t%s.%s\n" % (outcome, NAME, test))
                    record.flush()
            ran += len(outcomes)
        if record:
            record.write("end\t%s\t%d\n" % (NAME, ran))
        for name in sorted(os.listdir(tmp)):
            if name.startswith("sanitizer."):
                report = read_text(os.path.join(tmp, name))
                if SANITIZER_REPORT.search(report):
                    sys.stderr.write("%s:\n%s\n" % (name, report))
                    ok = False
    finally:
        if record:
            record.close()
        code = esid.stop()
        if code != 0:
            sys.stderr.write("esid ended with status %s:\n%s\n"
                             % (code, esid.stderr(2000)))
            ok = False
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            sys.stderr.write("kept for a look: %s\n" % tmp)

    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
