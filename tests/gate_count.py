#!/usr/bin/env python3
"""Counts what the gate ran: every unit test (one ctest test per gtest) and
every integration test method, not every integration file.

    gate_count.py --junit CTEST.xml --results DIR [--expected-skips FILE]
    gate_count.py --results DIR --modules test_markup test_headers ...

The first form reads ctest's JUnit report (ctest --output-junit) and, for
each ctest test named integration.MODULE, the outcomes that
integration/run_counted.py wrote to DIR/MODULE.results; the second reads
only the results of the modules named (tests/build-matrix.sh runs unittest
without ctest).  Counted:

- passed: a unit test that passed; a test method that passed or failed as
  it is marked to (expectedFailure);
- failed: a unit test that failed, timed out or did not run; a method that
  failed, erred or passed although marked expectedFailure; a skip that
  FILE (default tests/expected-skips) does not list; and one more for an
  integration file whose run ended without its results (a crash, a ctest
  timeout, a module that does not import), ran fewer tests than unittest's
  loader found in it before the run (its "expect" line: a run that stopped
  early fails instead of shrinking the count) or failed outside any
  method;
- skipped: a skip that FILE lists, printed with its reason.

Prints what failed ("NAME: FAILED what") and what was skipped ("NAME:
skipped test: reason"), then a last line
"NAME: N passed, N failed, N skipped" (NAME: --name, default "gate").  Exits 0 when nothing failed.
"""

import argparse
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def read_expected_skips(path):
    """[(id pattern, reason pattern)] from FILE, one a line: a test id and
    the reason its skip gives, both fnmatch patterns (the reason is the
    rest of the line); '#' starts a comment, which says why CI skips it."""
    expected = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            pattern, _, reason = line.partition(" ")
            expected.append((pattern, reason.strip() or "*"))
    return expected


def read_junit(path):
    """[(ctest name, passed?)] from ctest's JUnit report."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        status = case.get("status", "")
        bad = case.find("failure") is not None or \
            case.find("error") is not None or \
            case.find("skipped") is not None
        tests.append((case.get("name"), status == "run" and not bad))
    return tests


class Tally:
    def __init__(self, expected_skips, name="gate"):
        self.expected_skips = expected_skips
        self.name = name
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.lines = []

    def fail(self, what):
        self.failed += 1
        self.lines.append("%s: FAILED %s" % (self.name, what))

    def module(self, name, results_dir, ctest_passed=None):
        """Adds the outcomes in results_dir/name.results."""
        path = os.path.join(results_dir, name + ".results")
        try:
            with open(path) as f:
                rows = [l.rstrip("\n").split("\t") for l in f if l.strip()]
        except OSError:
            rows = None
        if rows is None:
            self.fail("%s: no results (the file did not run, or did not "
                      "import)" % name)
            return
        expected = None
        if rows and rows[0][0] == "expect":
            expected = int(rows[0][2]) if len(rows[0]) > 2 and \
                rows[0][2].isdigit() else None
            rows = rows[1:]
        ended = bool(rows) and rows[-1][0] == "end"
        ran = int(rows[-1][2]) if ended and len(rows[-1]) > 2 and \
            rows[-1][2].isdigit() else None
        failed_before = self.failed
        for row in rows[:-1] if ended else rows:
            outcome, test = row[0], row[1] if len(row) > 1 else "?"
            reason = row[2] if len(row) > 2 else ""
            if outcome in ("pass", "xfail"):
                self.passed += 1
            elif outcome == "skip":
                if self.expected(test, reason):
                    self.skipped += 1
                    self.lines.append("%s: skipped %s: %s" % (
                        self.name, test, reason))
                else:
                    self.fail("%s: skipped, and CI expects no such skip "
                              "(tests/expected-skips): %s" % (test, reason))
            elif outcome == "xpass":
                self.fail("%s: passed, but is marked expectedFailure" % test)
            else:
                self.fail("%s (%s)" % (test, outcome))
        if expected is None:
            self.fail("%s: its results do not say how many tests it has "
                      "(run_counted.py's \"expect\" line)" % name)
        if not ended:
            self.fail("%s: its run ended before its last test (crashed, "
                      "killed or timed out)%s" % (name, "" if expected is None
                                                  else ": %d of its %d tests "
                                                  "reported" % (len(rows),
                                                                expected)))
        elif expected is not None and ran != expected:
            self.fail("%s: ran %s of its %d tests (it stopped early, or a "
                      "class could not set up)" % (name, ran, expected))
        elif ctest_passed is False and self.failed == failed_before:
            self.fail("%s: ctest failed it outside any test method" % name)

    def expected(self, test, reason):
        return any(fnmatch.fnmatchcase(test, pattern)
                   and fnmatch.fnmatchcase(reason, why)
                   for pattern, why in self.expected_skips)

    def report(self, out):
        for line in self.lines:
            out.write(line + "\n")
        out.write("%s: %d passed, %d failed, %d skipped\n" % (
            self.name, self.passed, self.failed, self.skipped))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", help="ctest --output-junit report")
    p.add_argument("--results", required=True,
                   help="ESI_RESULTS_DIR of run_counted.py")
    p.add_argument("--modules", nargs="+", default=[],
                   help="integration modules run without ctest")
    p.add_argument("--name", default="gate",
                   help="the word each line of the report starts with")
    p.add_argument("--expected-skips",
                   default=os.path.join(HERE, "expected-skips"))
    args = p.parse_args(argv)
    if not args.junit and not args.modules:
        p.error("--junit or --modules is needed")

    tally = Tally(read_expected_skips(args.expected_skips), args.name)
    if args.junit:
        try:
            tests = read_junit(args.junit)
        except (OSError, ET.ParseError) as e:
            tests = []
            tally.fail("ctest's report %s: %s" % (args.junit, e))
        if not tests:
            tally.fail("ctest ran no test")
        for name, passed in tests:
            if name.startswith("integration."):
                tally.module(name[len("integration."):], args.results,
                             passed)
            elif passed:
                tally.passed += 1
            else:
                tally.fail(name)
    for name in args.modules:
        tally.module(name, args.results)
    tally.report(sys.stdout)
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
