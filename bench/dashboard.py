#!/usr/bin/env python3
"""The Grafana dashboard's queries, evaluated by Debian's Prometheus and drawn.

    bench/dashboard.py [--build-dir build] [--duration 300] [--keep]

Runs the soak's traffic (soak.Soak: pages half of them gzip, fragments,
an exact PURGE a second, a tag PURGE every 10 s; no esid restart) against
esid started with `--metrics`, Debian's `prometheus` scraping it every
SCRAPE seconds; then asks Prometheus for the dashboard's variables as
Grafana does (`label_values`, "All" selected) and evaluates every target of
packaging/grafana/esid-dashboard.json over the run with query_range, and
draws each panel with gnuplot into results/DATE-dashboard.png, with its
series' last values in results/DATE-dashboard.md.  Grafana is not in
Debian; this is its dashboard's data, not its rendering.

Exit status 1 when Prometheus refuses a query, a panel the traffic feeds
has no series, or a request of the traffic failed.
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reporting  # noqa: E402
import soak  # noqa: E402
from esitest import free_port, poll  # noqa: E402
from running import loadavg  # noqa: E402

DASHBOARD = os.path.join(HERE, "..", "packaging", "grafana",
                         "esid-dashboard.json")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE = 2             # seconds between scrapes, the data source's interval
# Panels this run has nothing for, and why.
NOT_FED = {
    "Fleet": "no fleet in this run (see bench/fleet.py)",
    "Zone scan duration": "the index answers every purge; no directory read",
}
UNITS = {"percentunit": ("%", 100.0), "s": ("ms", 1000.0),
         "reqps": ("requests/s", 1.0), "ops": ("/s", 1.0),
         "short": ("", 1.0)}

PROMETHEUS_YML = """\
global:
  scrape_interval: {scrape}s
scrape_configs:
  - job_name: esid
    static_configs:
      - targets: ['127.0.0.1:{port}']
"""


def log(msg):
    reporting.log("dashboard: " + msg)


class DashboardSoak(soak.Soak):
    """The soak's traffic, esid serving /metrics on a port of its own."""

    def esid_options(self):
        self.metrics_port = free_port()
        return super().esid_options() + [
            "--metrics", "127.0.0.1:%d" % self.metrics_port]


def api(port, path, **params):
    """Prometheus's answer's data; raises ValueError with its error."""
    url = "http://127.0.0.1:%d/api/v1/%s?%s" % (
        port, path, urllib.parse.urlencode(params, doseq=True))
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as e:
        answer = json.load(e)
    if answer.get("status") != "success":
        raise ValueError("%s: %s" % (answer.get("errorType"),
                                     answer.get("error")))
    return answer["data"]


def start_prometheus(servers, metrics_port):
    d = os.path.join(servers.tmp, "prometheus")
    os.makedirs(d)
    config = os.path.join(d, "prometheus.yml")
    with open(config, "w") as f:
        f.write(PROMETHEUS_YML.format(scrape=SCRAPE, port=metrics_port))
    port = free_port()
    proc = servers.spawn("prometheus", [
        PROMETHEUS, "--config.file=" + config,
        "--storage.tsdb.path=" + os.path.join(d, "data"),
        "--web.listen-address=127.0.0.1:%d" % port])

    def scraped():
        try:
            return api(port, "query", query='up{job="esid"} == 1')["result"]
        except (OSError, ValueError):
            return None
    if not poll(scraped, bound=60.0):
        with open(proc.stderr_path, errors="replace") as f:
            raise RuntimeError("prometheus did not scrape esid:\n"
                               + f.read()[-3000:])
    return port


def variables(port, dashboard):
    """The dashboard's query variables with "All" selected, as Grafana
    writes a multi-value regex: (a|b)."""
    values = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        expr = var["query"]["query"]
        for name, value in values.items():
            expr = expr.replace("$" + name, value)
        metric, label = expr[len("label_values("):-1].rsplit(",", 1)
        found = api(port, "label/%s/values" % label.strip(),
                    **{"match[]": metric.strip()})
        if not found:
            raise ValueError("variable %s: %s matches nothing" % (
                var["name"], expr))
        values[var["name"]] = "(%s)" % "|".join(found)
    return values


def legend(fmt, metric):
    for k, v in metric.items():
        fmt = fmt.replace("{{%s}}" % k, v)
    return fmt


def evaluate(port, dashboard, start, end):
    """[(panel, [(title, [(t, value)])], error)] for every panel."""
    values = variables(port, dashboard)
    step = SCRAPE
    values["__rate_interval"] = "%ds" % max(step + SCRAPE, 4 * SCRAPE)
    panels = []
    for panel in dashboard["panels"]:
        series, error = [], None
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name in sorted(values, key=len, reverse=True):
                expr = expr.replace("$" + name, values[name])
            try:
                data = api(port, "query_range", query=expr, start=start,
                           end=end, step=step)
            except ValueError as e:
                error = "%s: %s" % (target["expr"], e)
                break
            for result in data["result"]:
                points = [(float(t) - start, float(v))
                          for t, v in result["values"]
                          if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    series.append((legend(target.get("legendFormat", ""),
                                          result["metric"]), points))
        panels.append((panel, series, error))
    return panels


def plot(png, panels, workdir, seconds):
    lines = ["set terminal pngcairo noenhanced size 1600,%d font ',10'"
             % (330 * ((len(panels) + 1) // 2)),
             "set output '%s'" % png,
             "set multiplot layout %d,2" % ((len(panels) + 1) // 2),
             "set grid", "set key top left", "set xlabel 'seconds'",
             "set xrange [0:%d]" % seconds]
    for n, (panel, series, error) in enumerate(panels):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit",
                                                                   "short")
        label, scale = UNITS.get(unit, ("", 1.0))
        lines.append("set title \"%s\"" % panel["title"].replace('"', "'"))
        lines.append("set ylabel '%s'" % label)
        if not series:
            why = error or NOT_FED.get(panel["title"], "no series")
            lines += ["unset key", "set yrange [0:1]",
                      "set label 1 \"%s\" at graph 0.5,0.5 center"
                      % why.replace('"', "'"),
                      "plot 2 notitle", "unset label 1",
                      "set yrange [*:*]", "set key top left"]
            continue
        # Series that stayed 0 say nothing beside others (Grafana's
        # "hide series with only zeros"); a panel all 0 keeps them.
        shown = [s for s in series if any(v for _, v in s[1])] or series
        plots = []
        for k, (title, points) in enumerate(shown):
            path = os.path.join(workdir, "panel%d-%d.dat" % (n, k))
            with open(path, "w") as f:
                f.writelines("%g %g\n" % (t, v * scale) for t, v in points)
            plots.append("'%s' using 1:2 with lines lw 2 title \"%s\""
                         % (path, title.replace('"', "'")))
        lines.append("plot " + ", ".join(plots))
    lines.append("unset multiplot")
    return png if reporting.gnuplot("\n".join(lines) + "\n") else None


def report(md, panels, started, load, counts):
    with open(md, "w") as f:
        f.write("# The dashboard's queries, %s\n\n" % started.strftime(
            "%Y-%m-%d %H:%M"))
        f.write("Load average %s. Traffic: %d requests (%d failed), %d "
                "exact purges, %d tag purges.\n\n" % (
                    load, counts["requests"], counts["failed"],
                    counts["purges"], counts["tag_purges"]))
        f.write("| panel | series | mean | max |\n| --- | --- | --- | --- |\n")
        for panel, series, error in panels:
            if not series:
                f.write("| %s | %s | | |\n" % (panel["title"], error or
                        NOT_FED.get(panel["title"], "no series")))
            for title, points in series:
                values = [v for _, v in points]
                f.write("| %s | %s | %.3g | %.3g |\n" % (
                    panel["title"], title, sum(values) / len(values),
                    max(values)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    args = argparse.Namespace(
        build_dir=os.path.abspath(a.build_dir), duration=a.duration,
        warmup=0, interval=10, restart_every=0, rate=100, clients=4,
        keep=a.keep, workers="2")
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    started = datetime.datetime.now()
    run = DashboardSoak(args)
    ok = False
    try:
        run.start()
        prometheus = start_prometheus(run.servers, run.metrics_port)
        start = time.time()
        run.run()
        end = time.time()
        load = loadavg()
        panels = evaluate(prometheus, dashboard, start, end)
        os.makedirs(a.results, exist_ok=True)
        base = os.path.join(a.results, "%s-dashboard" % started.strftime(
            "%Y-%m-%d"))
        png = plot(base + ".png", panels, run.servers.tmp, end - start)
        report(base + ".md", panels, started, load, run.counts)
        missing = []
        for panel, series, error in panels:
            title = panel["title"]
            if error:
                log("%s: Prometheus refused %s" % (title, error))
                missing.append(title)
            elif not series and title not in NOT_FED:
                log("%s: no series" % title)
                missing.append(title)
            else:
                log("%s: %d series" % (title, len(series)))
        for x in run.problems:
            log("problem: " + x)
        log("results: %s.md%s" % (base, ", " + png if png else ""))
        ok = not missing and not run.problems and run.counts["failed"] == 0
        return 0 if ok else 1
    finally:
        run.servers.finish(ok, a.keep)


if __name__ == "__main__":
    sys.exit(main())
