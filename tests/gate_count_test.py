"""tests/gate_count.py and integration/run_counted.py on made-up inputs:
what the gate counts as passed, failed and skipped (ctest: gate.count)."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
COUNT = os.path.join(HERE, "gate_count.py")
RUNNER = os.path.join(HERE, "integration", "run_counted.py")

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite tests="3">
  <testcase name="Unit.Passes" status="run"/>
  <testcase name="Unit.Fails" status="fail"><failure message="Failed"/></testcase>
  %s
</testsuite>
"""

MODULE = '''
import unittest

class T(unittest.TestCase):
    def test_passes(self):
        pass

    def test_fails(self):
        self.assertEqual(1, 2)

    def test_errs(self):
        raise RuntimeError("boom")

    def test_skipped_as_expected(self):
        self.skipTest("listed")

    def test_skipped_unexpectedly(self):
        self.skipTest("the machine said no")

    @unittest.expectedFailure
    def test_known_bug(self):
        self.assertTrue(False)

    @unittest.expectedFailure
    def test_known_bug_gone(self):
        pass
'''

# A module whose run stops after its first test, as unittest's failfast or
# its ^C handler stop one (TestResult.stop()): it still ends ("end" line).
STOPS_EARLY = '''
import unittest

class S(unittest.TestCase):
    def run(self, result=None):
        result.stop()
        return super().run(result)

    def test_1(self):
        pass

    def test_2(self):
        pass

    def test_3(self):
        pass
'''


class GateCountTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.results = os.path.join(self.dir.name, "results")
        os.mkdir(self.results)
        self.skips = self.write("expected-skips", """\
            # comment
            fake_module.T.test_skipped_as_expected  listed
            # the right test for another reason is not expected
            fake_module.T.test_skipped_unexpectedly  the machine said yes
            """)

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def results_file(self, module, text):
        with open(os.path.join(self.results, module + ".results"), "w") as f:
            f.write(text)

    def count(self, *args):
        r = subprocess.run([sys.executable, COUNT, "--results", self.results,
                            "--expected-skips", self.skips] + list(args),
                           capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout.splitlines()

    def run_module(self, name="fake_module", text=MODULE):
        """run_counted.py on a module; returns its exit status."""
        self.write(name + ".py", text)
        env = dict(os.environ, ESI_RESULTS_DIR=self.results,
                   PYTHONPATH=self.dir.name, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, RUNNER, name],
                              cwd=self.dir.name, env=env, capture_output=True,
                              timeout=60).returncode

    def test_each_method_is_counted_and_an_unlisted_skip_fails(self):
        self.assertEqual(self.run_module(), 1)
        code, lines = self.count("--modules", "fake_module")
        self.assertEqual(code, 1)
        self.assertEqual(lines[-1], "gate: 2 passed, 4 failed, 1 skipped")
        self.assertIn("gate: skipped fake_module.T.test_skipped_as_expected: "
                      "listed", lines)
        self.assertIn("gate: FAILED fake_module.T.test_skipped_unexpectedly: "
                      "skipped, and CI expects no such skip "
                      "(tests/expected-skips): the machine said no", lines)
        self.assertIn("gate: FAILED fake_module.T.test_fails (fail)", lines)
        self.assertIn("gate: FAILED fake_module.T.test_errs (error)", lines)
        self.assertIn("gate: FAILED fake_module.T.test_known_bug_gone: "
                      "passed, but is marked expectedFailure", lines)

    def assertOnePassOneFailure(self, module, failure):
        code, lines = self.count("--modules", module)
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["gate: FAILED %s: %s" % (module, failure),
                                 "gate: 1 passed, 1 failed, 0 skipped"])

    def test_a_run_that_stops_early_fails_instead_of_shrinking(self):
        self.run_module("stops_early", STOPS_EARLY)
        with open(os.path.join(self.results, "stops_early.results")) as f:
            self.assertEqual(f.read(), "expect\tstops_early\t3\n"
                             "pass\tstops_early.S.test_1\n"
                             "end\tstops_early\t1\n")
        self.assertOnePassOneFailure("stops_early", "ran 1 of its 3 tests "
                                     "(it stopped early, or a class could "
                                     "not set up)")

    def test_a_file_cut_short_says_how_many_of_its_tests_it_reported(self):
        self.results_file("test_x", "expect\ttest_x\t40\n"
                          "pass\ttest_x.A.test_1\n")
        self.assertOnePassOneFailure("test_x", "its run ended before its "
                                     "last test (crashed, killed or timed "
                                     "out): 1 of its 40 tests reported")

    def test_results_without_the_expected_count_are_a_failure(self):
        self.results_file("test_x", "pass\ttest_x.A.test_1\n"
                          "end\ttest_x\t1\n")
        self.assertOnePassOneFailure("test_x", "its results do not say how "
                                     "many tests it has (run_counted.py's "
                                     "\"expect\" line)")

    def test_ctest_report_counts_unit_tests_and_integration_methods(self):
        self.results_file("test_x", "expect\ttest_x\t2\n"
                          "pass\ttest_x.A.test_1\n"
                          "pass\ttest_x.A.test_2\nend\ttest_x\t2\n")
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_x" status="run"/>'))
        code, lines = self.count("--junit", junit, "--name", "build")
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["build: FAILED Unit.Fails",
                                 "build: 3 passed, 1 failed, 0 skipped"])

    def test_a_file_cut_short_is_one_more_failure(self):
        self.results_file("test_x", "expect\ttest_x\t2\n"
                          "pass\ttest_x.A.test_1\n")
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_x" status="fail">'
            '<failure message="Timeout"/></testcase>'))
        code, lines = self.count("--junit", junit)
        self.assertEqual(lines[-1], "gate: 2 passed, 2 failed, 0 skipped")
        self.assertIn("gate: FAILED test_x: its run ended before its last "
                      "test (crashed, killed or timed out): 1 of its 2 tests "
                      "reported", lines)

    def test_a_file_failed_outside_its_methods_is_a_failure(self):
        self.results_file("test_x", "expect\ttest_x\t1\n"
                          "pass\ttest_x.A.test_1\nend\ttest_x\t1\n")
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_x" status="fail">'
            '<failure message="Failed"/></testcase>'))
        code, lines = self.count("--junit", junit)
        self.assertEqual(lines[-1], "gate: 2 passed, 2 failed, 0 skipped")
        self.assertIn("gate: FAILED test_x: ctest failed it outside any test "
                      "method", lines)

    def test_a_file_without_results_is_a_failure(self):
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_y" status="run"/>'))
        code, lines = self.count("--junit", junit)
        self.assertEqual(lines[-1], "gate: 1 passed, 2 failed, 0 skipped")

    def test_an_empty_ctest_report_is_a_failure(self):
        junit = self.write("junit.xml", "<testsuite/>")
        code, lines = self.count("--junit", junit)
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["gate: FAILED ctest ran no test",
                                 "gate: 0 passed, 1 failed, 0 skipped"])


if __name__ == "__main__":
    unittest.main()
