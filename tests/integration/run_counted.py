"""Runs test modules as `python3 -m unittest -v MODULE...` does, same output,
and writes one line per test outcome for the gate to count
(tests/gate_count.py): ctest registers each integration file as one test,
so its own count says nothing of the methods inside, nor of their skips.

    python3 run_counted.py test_markup [test_cache ...]

With ESI_RESULTS_DIR set, each module's outcomes go to
ESI_RESULTS_DIR/MODULE.results as they happen, one tab-separated line each:

    pass    test_markup.IncludeTest.test_x
    fail    test_markup.IncludeTest.test_y
    error   setUpClass (test_markup.IncludeTest)
    skip    test_esid.SocketDeniedTest.test_z    workers run as nobody ...
    xfail   ...                 (an expectedFailure that failed: counted passed)
    xpass   ...                 (an expectedFailure that passed: counted failed)

and a last line "end MODULE TESTS_RUN" once the module ran to its end: a
file without it comes from a run that crashed or was killed (a ctest
timeout), which the gate counts as one more failure.  The first line,

    expect  test_esid   31

written before any test runs, is how many test methods unittest's loader
found in the module (each HTTP/2 variant one more): the gate counts a run
that reported fewer (it stopped early, or lost methods) as one more
failure too.  Exits as unittest does: 0 when every test passed or was
skipped.
"""

import os
import sys
import unittest


def _clean(text):
    return " ".join(str(text).split())


class RecordingResult(unittest.TextTestResult):
    """TextTestResult that also appends each outcome to `record`."""

    record = None   # the open results file of the module being run

    def _write(self, outcome, test, reason=""):
        if self.record is None:
            return
        line = "%s\t%s" % (outcome, test.id())
        if reason:
            line += "\t" + _clean(reason)
        self.record.write(line + "\n")
        self.record.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._write("pass", test)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._write("fail", test)

    def addError(self, test, err):
        super().addError(test, err)
        self._write("error", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._write("skip", test, reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._write("xfail", test)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._write("xpass", test)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._write("fail" if failed else "error", subtest)


def run_module(name, results_dir):
    suite = unittest.defaultTestLoader.loadTestsFromName(name)
    record = None
    if results_dir:
        record = open(os.path.join(results_dir, name + ".results"), "w")
        record.write("expect\t%s\t%d\n" % (name, suite.countTestCases()))
        record.flush()
    RecordingResult.record = record
    try:
        runner = unittest.TextTestRunner(verbosity=2,
                                         resultclass=RecordingResult)
        result = runner.run(suite)
        if record is not None:
            record.write("end\t%s\t%d\n" % (name, result.testsRun))
    finally:
        RecordingResult.record = None
        if record is not None:
            record.close()
    return result.wasSuccessful()


def main(argv):
    if not argv:
        sys.stderr.write("usage: run_counted.py MODULE...\n")
        return 2
    results_dir = os.environ.get("ESI_RESULTS_DIR")
    if results_dir:
        os.makedirs(results_dir, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ok = True
    for name in argv:
        ok = run_module(name, results_dir) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
