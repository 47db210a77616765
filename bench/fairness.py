#!/usr/bin/env python3
"""Latency tail of the esi target once esid is the bottleneck, by worker count.

    python3 bench/fairness.py --build-dir build-bench [--page 256-dense-0]

Starts the bench targets (running.Bench, as bench.py does) with 1 and then 2
nginx workers and drives the esi target with wrk at 8, 16 and 32
connections on one cost-matrix page (256 KB markup-dense by default: esid's
parse is the bottleneck there).
Prints the latency percentiles and the `$esi_status` of every answer, and
the esi lines of the error log.  A fair esid keeps p99 within a small
multiple of p50 however many workers feed it; answers other than
`processed` mean a page went out unprocessed (esi_fallback passthrough).
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from running import Bench  # noqa: E402
from workload import KB  # noqa: E402

LUA = """\
done = function(summary, latency, requests)
  for _, p in pairs({50, 90, 99, 99.9}) do
    io.write(string.format("p%g=%.1fms ", p, latency:percentile(p) / 1000))
  end
  io.write(string.format("max=%.1fms\\n", latency.max / 1000))
end
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--page", default="256-dense-0",
                   help="a cost page: SIZEKB-dense|text-0|16")
    p.add_argument("--duration", type=int, default=6)
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    path = "/cost/%s.html" % args.page
    size, kind, inc = args.page.split("-")
    row = (int(size) * KB, kind, int(inc))

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(LUA)
        script = f.name
    problems = 0
    try:
        for workers in ("1", "2"):
            b = Bench(argparse.Namespace(
                build_dir=args.build_dir, workers=workers, threads=2,
                connections=32))
            try:
                b.start()
                target = b.targets["esi"]
                alog = os.path.join(b.tmp, "esi", "access.log")
                elog = os.path.join(b.tmp, "esi", "error.log")
                problem = b.verify(target, path,
                                   b.expected[("cost", row, "on")], False)
                if problem:
                    print("%s differs: %s" % (path, problem))
                    return 1
                for conns in (8, 16, 32):
                    seen = os.path.getsize(alog)
                    r = subprocess.run(
                        ["wrk", "-t2", "-c%d" % conns,
                         "-d%ds" % args.duration, "--timeout", "10s",
                         "-s", script, target.url(path)],
                        capture_output=True, text=True)
                    with open(alog) as f:
                        f.seek(seen)
                        statuses = collections.Counter(
                            line.split(" ", 1)[1].strip() for line in f
                            if line.startswith("200 "))
                    tail = r.stdout.strip().splitlines()[-1]
                    print("workers=%s c=%-2d %s  %s" % (
                        workers, conns, tail, dict(statuses)))
                    problems += sum(n for s, n in statuses.items()
                                    if s != "processed")
                with open(elog) as f:
                    reasons = collections.Counter(
                        re.sub(r"^.*?\[\w+\] \d+#\d+: (\*\d+ )?", "",
                               line).split(",")[0]
                        for line in f if "esi:" in line)
                for reason, n in reasons.most_common(6):
                    print("    error.log %5d x %s" % (n, reason))
            finally:
                b.stop()
                shutil.rmtree(b.tmp, ignore_errors=True)
    finally:
        os.unlink(script)
    print("pages not processed: %d" % problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
