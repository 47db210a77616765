#!/usr/bin/env python3
"""The benchmark driver behind bench/run.sh (which installs and builds first).

Starts, each on its own 127.0.0.1 port with its own temporary prefix:

  origin   Debian nginx + the echo module: the page shells as static files,
           the fragments as `echo` locations behind `echo_sleep` D ms
  esi      Debian nginx + ngx_http_esi_module + esid (this project)
  varnish  Debian's Varnish 7.1, do_esi + do_gzip on the shell, fragments
           passed (uncached)
  ssi      Debian nginx with its own SSI on <!--# include virtual --> pages
  noesi    Debian nginx + the module loaded but `esi off`, serving the
           already-assembled page (same bytes, no assembly)

Every target's answer is checked byte for byte (after gunzip) against the
page computed here before it is timed; a target that differs is reported
and not timed.  Each figure is the median of several interleaved wrk runs;
the `esi` target is measured twice per row (the A/A arm).

Everything started here is stopped on the way out, also on failure.

The parts: workload.py (the matrices, their pages and fragments),
running.py (the targets, checking, wrk, CPU), reporting.py (markdown,
CSV, plots, bench/README.md), and the test-support package esitest
(tests/support/esitest: ports, processes, nginx) shared with the
integration tests.
"""

import argparse
import datetime
import os
import sys
import time

from reporting import log, update_readme, write_results
from running import (Bench, exit_on_signals, loadavg, machine_info,
                     measure_rows, smoke)
from workload import (COST_ARMS, COST_INCLUDES, COST_KINDS, COST_SIZES,
                      DELAYS, FRAGMENTS, LANG_ARMS, LANG_HEADERS, LANG_SIZES,
                      MAIN_ARMS)

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("smoke", "short", "full"),
                   default="short")
    p.add_argument("--build-dir", required=True)
    p.add_argument("--product", default="?")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", default="2",
                   help="worker_processes of every nginx")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--duration", type=int, help="seconds per wrk run")
    p.add_argument("--cost-duration", type=int)
    p.add_argument("--runs", type=int, help="runs per figure (median)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (configs, logs)")
    p.add_argument("--no-readme", action="store_true",
                   help="do not update bench/README.md")
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)

    if args.mode == "full":
        rows = [(n, d) for n in FRAGMENTS for d in DELAYS]
        cost_rows = [(s, k, i) for s in COST_SIZES for k in COST_KINDS
                     for i in COST_INCLUDES]
        defaults = (4, 3, 2)
    else:
        rows = [(n, d) for n in (1, 32) for d in (0, 50)]
        cost_rows = []
        defaults = (2, 3, 2)
    if args.mode == "smoke":
        cost_rows = [(s, k, i) for s in COST_SIZES for k in COST_KINDS
                     for i in COST_INCLUDES]
    lang_rows = [("lang", s, plans) for s in LANG_SIZES
                 for plans in ("off", "on")]
    # Under 2 s a run can end before a 32 x 50 ms page (1.6 s at Varnish)
    # completes at all.
    if (args.duration or 2) < 2 or (args.cost_duration or 2) < 1:
        p.error("--duration must be at least 2 s, --cost-duration 1 s")
    args.duration = args.duration or defaults[0]
    args.runs = args.runs or defaults[1]
    args.cost_duration = args.cost_duration or defaults[2]

    exit_on_signals()

    bench = Bench(args)
    started = datetime.datetime.now()
    t0 = time.monotonic()
    load_before = loadavg()
    ok = False
    try:
        bench.start()
        targets = bench.targets
        if args.mode == "smoke":
            ok = smoke(bench, rows, cost_rows, lang_rows, t0)
            return 0 if ok else 1

        info = machine_info(args)
        log("machine: %(nproc)d cores, %(cpu)s, Linux %(kernel)s, nginx "
            "%(nginx)s, varnish %(varnish)s, wrk %(wrk)s; %(product)s" % info)
        log("%s mode: %d rows x %d arms x %d runs x %d s%s" % (
            args.mode, len(rows), len(MAIN_ARMS), args.runs, args.duration,
            "; cost: %d rows x %d arms x %d runs x %d s" % (
                len(cost_rows), len(COST_ARMS), args.runs,
                args.cost_duration) if cost_rows else "") +
            "; language: %d rows x %d arms" % (len(lang_rows), len(LANG_ARMS)))
        main_res = measure_rows(bench, rows, MAIN_ARMS, bench.resolve_main,
                                True, args.runs, args.duration)
        cost_res = measure_rows(bench, cost_rows, COST_ARMS,
                                bench.resolve_cost, False, args.runs,
                                args.cost_duration)
        lang_res = measure_rows(bench, lang_rows, LANG_ARMS,
                                bench.resolve_lang, False, args.runs,
                                args.cost_duration, LANG_HEADERS)
        for name, t in targets.items():
            if not t.alive():
                raise RuntimeError("%s died during the run" % name)
        elapsed = time.monotonic() - t0
        base, md, plots = write_results(args, info, main_res, cost_res,
                                        lang_res,
                                        started, load_before, loadavg(),
                                        elapsed)
        print()
        print(md)
        log("results: %s.csv, %s.md%s" % (base, base, "".join(
            ", " + p for p in plots)))
        if not args.no_readme:
            update_readme(md, plots, raw=(base + ".csv", base + ".md"))
        ok = True
        return 0
    finally:
        bench.finish(ok, args.keep)


if __name__ == "__main__":
    sys.exit(main())
