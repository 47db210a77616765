"""The benchmark's reporting: the figures' formats and ratios, the progress
line of each row, and the results: markdown, CSV, gnuplot charts, and the
sections of bench/README.md between their markers.
"""

import csv
import os
import shutil
import subprocess
import sys

from workload import ARM_LABEL, SHELL_SIZE, TARGET_OF_ARM, row_label, \
    size_label

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    sys.stdout.write("bench: %s\n" % msg)
    sys.stdout.flush()



# -- figures -----------------------------------------------------------------------

def fmt(v, digits=0):
    if v != v:
        return "n/a"
    if digits == 0:
        return "{:,.0f}".format(v) if v >= 100 else "{:,.1f}".format(v)
    return "{:,.{d}f}".format(v, d=digits)


def fmt_ms(v):
    if v != v:
        return "n/a"
    return "%.0f" % v if v >= 100 else ("%.1f" % v if v >= 10 else "%.2f" % v)


def print_row(row, arms, res):
    parts = []
    for arm in arms:
        r = res[arm]
        if "differs" in r:
            parts.append("%s DIFFERS" % ARM_LABEL[arm])
        else:
            parts.append("%s %s rps (p50 %s ms, p99 %s ms, %s us cpu/req)" % (
                ARM_LABEL[arm], fmt(r["rps"]), fmt_ms(r["p50"]),
                fmt_ms(r["p99"]), fmt(r["cpu_us"])))
    log("%s: %s" % (row_label(row), "; ".join(parts)))


def ratio(a, b):
    try:
        return a["rps"] / b["rps"]
    except (KeyError, ZeroDivisionError, TypeError):
        return float("nan")


def composed_limit(fragment, page):
    """The rate of a server that must send both `page` and `fragment` for
    every request, at the rates each is served alone: 1 / (1/a + 1/b)."""
    try:
        return {"rps": 1.0 / (1.0 / fragment["rps"] + 1.0 / page["rps"])}
    except (KeyError, ZeroDivisionError, TypeError):
        return {"rps": float("nan")}


def fmt_ratio(x):
    if x != x:
        return "n/a"
    return "%.2fx" % x


def pct(x):
    if x != x:
        return "n/a"
    return "%+.1f%%" % ((x - 1) * 100)


def verdict(ours, theirs, aa):
    """Who wins a row, given the A/A drift as the noise floor."""
    r = ratio(ours, theirs)
    if r != r:
        return "n/a"
    noise = max(abs(aa - 1) if aa == aa else 0, 0.05)
    if abs(r - 1) <= noise:
        return "tie (within A/A noise)"
    return "**ours**" if r > 1 else "**Varnish**"


# -- results -----------------------------------------------------------------------

def write_results(args, info, main_res, cost_res, lang_res, started,
                  load_before, load_after, elapsed):
    os.makedirs(args.results, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d")
    base = os.path.join(args.results, "%s-%s" % (stamp, args.mode))

    # CSV: one line per (matrix, row, arm).
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["matrix", "fragments", "delay_ms", "page_bytes", "kind",
                    "includes", "arm", "target", "verified", "rps", "p50_ms",
                    "p99_ms", "cpu_us_per_req", "esid_cpu_us_per_req", "requests", "errors",
                    "unprocessed", "rps_runs"])
        for row, arms in main_res.items():
            for arm, r in arms.items():
                w.writerow(["fragments", row[0], row[1], SHELL_SIZE, "shell",
                            ""]
                           + csv_arm(arm, r))
        for row, arms in cost_res.items():
            for arm, r in arms.items():
                w.writerow(["cost", "", "", row[0], row[1], row[2]]
                           + csv_arm(arm, r))
        for row, arms in lang_res.items():
            for arm, r in arms.items():
                w.writerow(["language", "", "", row[1], "plans " + row[2],
                            ""] + csv_arm(arm, r))

    md = markdown(args, info, main_res, cost_res, lang_res, started,
                  load_before, load_after, elapsed)
    with open(base + ".md", "w") as f:
        f.write(md)
    plots = plot(args, base, main_res, cost_res)
    return base, md, plots


def csv_arm(arm, r):
    target = TARGET_OF_ARM[arm]
    if "differs" in r:
        return [arm, target, "differs: " + r["differs"]] + [""] * 9
    return [arm, target, "yes", "%.1f" % r["rps"], "%.3f" % r["p50"],
            "%.3f" % r["p99"], "%.1f" % r["cpu_us"],
            "" if r["cpu_us_esid"] != r["cpu_us_esid"] else
            "%.1f" % r["cpu_us_esid"], r["requests"],
            r["errors"], r["unprocessed"],
            " ".join("%.1f" % x for x in r["rps_runs"])]


def cell(r, key, f):
    if "differs" in r:
        return "differs"
    return f(r[key])


def markdown(args, info, main_res, cost_res, lang_res, started, load_before,
             load_after, elapsed):
    L = []
    L.append("## %s run, %s" % (args.mode, started.strftime("%Y-%m-%d %H:%M")))
    L.append("")
    L.append("Machine: %d cores, %s, %s, Linux %s; nginx %s, Varnish %s, "
             "wrk %s. Measured: %s. Load average %s before, %s after; run "
             "took %d s. wrk -t%d -c%d, %d s per run, median of %d "
             "interleaved runs." % (
                 info["nproc"], info["cpu"], info["memory"], info["kernel"],
                 info["nginx"], info["varnish"], info["wrk"], info["product"],
                 load_before, load_after, elapsed, args.threads,
                 args.connections, args.duration, args.runs))
    L.append("")
    L.append("Deflating the 256 KB shell once at level 6 (zlib, as NGINX's "
             "gzip filter does per request and Varnish once per object) costs "
             "%.1f ms of CPU on this machine; it compresses %.1f:1." % (
                 info["deflate_ms"], info["deflate_ratio"]))
    L.append("")
    if main_res:
        L.append("### 256 KB cached shell, N uncached fragments, D ms origin "
                 "delay, gzip-accepting client")
        L.append("")
        L.append("Requests per second (median), ratios against Varnish and "
                 "against our own A/A arm. The last columns are the limit "
                 "of a 1-fragment row: one fragment fetched from the origin "
                 "with the same wrk, the assembled page gzipped ahead of "
                 "time and sent by an NGINX with `gzip_static`, and the two "
                 "composed (a page costs at least one of each on the same "
                 "cores: 1 / (1/fragment + 1/static)); for 8 and 32 "
                 "fragments they are only a reference:")
        L.append("")
        L.append("| N | D | esi_plan off | A/A | A/A drift | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | plan off / Varnish | "
                 "plans, no stitch / Varnish | minimal / Varnish | "
                 "nginx SSI | nginx, no ESI | plan off / no ESI | "
                 "faster (minimal) | one fragment from the origin | "
                 "minimal / it | Varnish / it | gzip_static page | "
                 "composed limit | minimal / limit | Varnish / limit |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                 "---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in main_res.items():
            aa = ratio(r["esi"], r["esi-aa"])
            limit = composed_limit(r["origin"], r["static"])
            L.append("| %d | %d ms | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |" % (
                         row[0], row[1],
                         cell(r["esi"], "rps", fmt),
                         cell(r["esi-aa"], "rps", fmt), pct(aa),
                         cell(r["esiplan"], "rps", fmt),
                         cell(r["minimal"], "rps", fmt),
                         cell(r["varnish"], "rps", fmt),
                         fmt_ratio(ratio(r["esi"], r["varnish"])),
                         fmt_ratio(ratio(r["esiplan"], r["varnish"])),
                         fmt_ratio(ratio(r["minimal"], r["varnish"])),
                         cell(r["ssi"], "rps", fmt),
                         cell(r["noesi"], "rps", fmt),
                         fmt_ratio(ratio(r["esi"], r["noesi"])),
                         verdict(r["minimal"], r["varnish"], aa),
                         cell(r["origin"], "rps", fmt),
                         fmt_ratio(ratio(r["minimal"], r["origin"])),
                         fmt_ratio(ratio(r["varnish"], r["origin"])),
                         cell(r["static"], "rps", fmt),
                         cell(limit, "rps", fmt),
                         fmt_ratio(ratio(r["minimal"], limit)),
                         fmt_ratio(ratio(r["varnish"], limit))))
        L.append("")
        L.append("Latency, p50 / p99 in ms (median of the runs):")
        L.append("")
        L.append("| N | D | esi_plan off | A/A | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | nginx SSI | nginx, no ESI |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in main_res.items():
            L.append("| %d | %d ms | %s |" % (row[0], row[1], " | ".join(
                cell(r[a], "p50", fmt_ms) + " / " + cell(r[a], "p99", fmt_ms)
                if "differs" not in r[a] else "differs"
                for a in ("esi", "esi-aa", "esiplan", "minimal", "varnish",
                          "ssi", "noesi"))))
        L.append("")
        L.append("CPU per request in microseconds (utime + stime of the "
                 "target's processes; ours counts nginx and esid, esid's "
                 "part in its own column):")
        L.append("")
        L.append("| N | D | esi_plan off | of it esid | A/A | plans, no stitch | "
                 "esi on (minimal) | Varnish 7.1 | plan off / Varnish | "
                 "nginx SSI | nginx, no ESI |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in main_res.items():
            try:
                cr = r["esi"]["cpu_us"] / r["varnish"]["cpu_us"]
            except (KeyError, ZeroDivisionError):
                cr = float("nan")
            L.append("| %d | %d ms | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |"
                     % (row[0], row[1], cell(r["esi"], "cpu_us", fmt),
                cell(r["esi"], "cpu_us_esid", fmt),
                cell(r["esi-aa"], "cpu_us", fmt),
                cell(r["esiplan"], "cpu_us", fmt),
                cell(r["minimal"], "cpu_us", fmt),
                cell(r["varnish"], "cpu_us", fmt), fmt_ratio(cr),
                cell(r["ssi"], "cpu_us", fmt),
                cell(r["noesi"], "cpu_us", fmt)))
        L.append("")
    if cost_res:
        L.append("### What ESI costs: esi off vs esi on, cached page, "
                 "fragments answered by `return 200`, plain (no gzip) client")
        L.append("")
        L.append("| page | kind | includes | esi off rps | esi on rps | A/A "
                 "rps | A/A drift | on / off | plans rps | plans / off | "
                 "off p99 ms | on p99 ms | plans p99 ms | off CPU us/req | "
                 "on CPU us/req | of it esid | plans CPU us/req | of it esid "
                 "| ssi on rps | ssi on p99 ms |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                 "---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in cost_res.items():
            aa = ratio(r["esi-on"], r["esi-on-aa"])
            L.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                     % (size_label(row[0]), row[1], row[2],
                        cell(r["esi-off"], "rps", fmt),
                        cell(r["esi-on"], "rps", fmt),
                        cell(r["esi-on-aa"], "rps", fmt), pct(aa),
                        fmt_ratio(ratio(r["esi-on"], r["esi-off"])),
                        cell(r["esi-plan"], "rps", fmt),
                        fmt_ratio(ratio(r["esi-plan"], r["esi-off"])),
                        cell(r["esi-off"], "p99", fmt_ms),
                        cell(r["esi-on"], "p99", fmt_ms),
                        cell(r["esi-plan"], "p99", fmt_ms),
                        cell(r["esi-off"], "cpu_us", fmt),
                        cell(r["esi-on"], "cpu_us", fmt),
                        cell(r["esi-on"], "cpu_us_esid", fmt),
                        cell(r["esi-plan"], "cpu_us", fmt),
                        cell(r["esi-plan"], "cpu_us_esid", fmt),
                        cell(r["ssi-filter"], "rps", fmt),
                        cell(r["ssi-filter"], "p99", fmt_ms)))
        L.append("")
    if lang_res:
        L.append("### The ESI language: 16 variables and 4 choose blocks "
                 "against the same page with their outcome written in, "
                 "esi on, cached page, plain client")
        L.append("")
        L.append("| page | plans | without rps | with rps | A/A rps | A/A "
                 "drift | with / without | without p99 ms | with p99 ms | "
                 "without CPU us/req | with CPU us/req | of it esid |")
        L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row, r in lang_res.items():
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |" % (
                         size_label(row[1]), row[2],
                         cell(r["without"], "rps", fmt),
                         cell(r["with"], "rps", fmt),
                         cell(r["with-aa"], "rps", fmt),
                         pct(ratio(r["with"], r["with-aa"])),
                         fmt_ratio(ratio(r["with"], r["without"])),
                         cell(r["without"], "p99", fmt_ms),
                         cell(r["with"], "p99", fmt_ms),
                         cell(r["without"], "cpu_us", fmt),
                         cell(r["with"], "cpu_us", fmt),
                         cell(r["with"], "cpu_us_esid", fmt)))
        L.append("")
    every = {}
    for res in (main_res, cost_res, lang_res):
        every.update(res)
    bad = [(row, arm) for row, arms in every.items()
           for arm, r in arms.items()
           if "differs" not in r and (r["errors"] or r["unprocessed"])]
    if bad:
        L.append("Runs with errors or unprocessed responses (wrk socket "
                 "errors/non-2xx, or `$esi_status` other than `processed`): " +
                 "; ".join("%s %s: %d errors, %d unprocessed" % (
                     row_label(row), ARM_LABEL[arm],
                     every[row][arm]["errors"],
                     every[row][arm]["unprocessed"])
                     for row, arm in bad) + ".")
        L.append("")
    differs = [(row, arm, r["differs"]) for row, arms in every.items()
               for arm, r in arms.items()
               if "differs" in r and not arm.endswith("-aa")]
    if differs:
        L.append("Targets whose output differed from the expected page (not "
                 "timed):")
        L.append("")
        for row, arm, why in differs:
            L.append("- %s, %s: %s" % (row_label(row), ARM_LABEL[arm],
                                        why[:300]))
        L.append("")
    return "\n".join(L)


def gnuplot(script):
    """Runs a gnuplot script (pngcairo, or png where cairo is missing);
    whether it wrote its picture."""
    if shutil.which("gnuplot") is None:
        log("gnuplot not found (apt-get install gnuplot-nox): no plot")
        return False
    r = subprocess.run(["gnuplot"], input=script, capture_output=True,
                       text=True)
    if r.returncode != 0 and "pngcairo" in script:
        r = subprocess.run(["gnuplot"], input=script.replace("pngcairo",
                                                             "png"),
                           capture_output=True, text=True)
    if r.returncode != 0:
        log("gnuplot failed: %s" % r.stderr.strip())
    return r.returncode == 0


def plot(args, base, main_res, cost_res):
    """PNG bar charts of rps and p99 per row, via gnuplot; returns paths."""
    if shutil.which("gnuplot") is None:
        log("gnuplot not found: no plots")
        return []
    made = []
    jobs = []
    if main_res:
        arms = ("esi", "esi-aa", "esiplan", "minimal", "varnish", "ssi",
                "noesi")
        rows = [("N=%d D=%d" % row, r) for row, r in main_res.items()]
        jobs += [(base + "-rps.png", "requests/s (log scale)", "rps", arms,
                  rows, "256 KB shell, N fragments, D ms: requests/s"),
                 (base + "-p99.png", "p99 latency, ms (log scale)", "p99",
                  arms, rows, "256 KB shell, N fragments, D ms: p99 latency")]
    if cost_res:
        arms = ("esi-off", "esi-on", "esi-on-aa", "esi-plan")
        rows = [("%s %s %d" % (size_label(row[0]).replace(" ", ""), row[1],
                               row[2]), r) for row, r in cost_res.items()]
        jobs += [(base + "-cost-rps.png", "requests/s (log scale)", "rps",
                  arms, rows, "ESI cost: esi off, on, on with plans: requests/s"),
                 (base + "-cost-p99.png", "p99 latency, ms (log scale)",
                  "p99", arms, rows, "ESI cost: esi off, on, on with plans: p99 latency")]
    for png, ylabel, key, arms, rows, title in jobs:
        dat = png[:-4] + ".dat"
        with open(dat, "w") as f:
            f.write("row " + " ".join('"%s"' % ARM_LABEL[a] for a in arms)
                    + "\n")
            for label, r in rows:
                vals = []
                for a in arms:
                    v = r[a].get(key, float("nan")) if a in r else float("nan")
                    vals.append("NaN" if v != v else "%.3f" % v)
                f.write('"%s" %s\n' % (label, " ".join(vals)))
        script = """
set terminal pngcairo size 1100,520 noenhanced font ",10"
set output '%s'
set title '%s'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set ylabel '%s'
set key outside right top
set grid ytics
%s
plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)
""" % (png, title, ylabel,
       "set xtics rotate by -30" if len(rows) > 9 else "", len(arms) + 1, dat)
        if gnuplot(script):
            made.append(png)
        os.unlink(dat)
    return made


def update_readme(md, plots, marker="latest", raw=()):
    """Replace the section of bench/README.md between the `marker` comments
    (latest: the ESI matrix; purge.py has its own), naming the run's raw
    results (`raw`: paths under results/) and showing its plots."""
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- %s:begin -->" % marker, "<!-- %s:end -->" % marker
    if begin not in text or end not in text:
        return
    pics = "".join("![%s](results/%s)\n" % (
        os.path.basename(p), os.path.basename(p)) for p in plots)
    if raw:
        pics = "Raw numbers: %s.\n\n" % ", ".join(
            "[`results/%s`](results/%s)" % (os.path.basename(p),
                                           os.path.basename(p))
            for p in raw) + pics
    body = "%s\n%s\n%s%s" % (begin, md.replace("## ", "### Latest: ", 1)
                             .replace("\n### ", "\n#### "), pics, end)
    text = text[:text.index(begin)] + body + text[text.index(end) +
                                                  len(end):]
    with open(path, "w") as f:
        f.write(text)

