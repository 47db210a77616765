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

    def run_module(self):
        """run_counted.py on MODULE; returns its exit status."""
        self.write("fake_module.py", MODULE)
        env = dict(os.environ, ESI_RESULTS_DIR=self.results,
                   PYTHONPATH=self.dir.name, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, RUNNER, "fake_module"],
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

    def test_ctest_report_counts_unit_tests_and_integration_methods(self):
        self.results_file("test_x", "pass\ttest_x.A.test_1\n"
                          "pass\ttest_x.A.test_2\nend\ttest_x\t2\n")
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_x" status="run"/>'))
        code, lines = self.count("--junit", junit, "--name", "build")
        self.assertEqual(code, 1)
        self.assertEqual(lines, ["build: FAILED Unit.Fails",
                                 "build: 3 passed, 1 failed, 0 skipped"])

    def test_a_file_cut_short_is_one_more_failure(self):
        self.results_file("test_x", "pass\ttest_x.A.test_1\n")
        junit = self.write("junit.xml", JUNIT % (
            '<testcase name="integration.test_x" status="fail">'
            '<failure message="Timeout"/></testcase>'))
        code, lines = self.count("--junit", junit)
        self.assertEqual(lines[-1], "gate: 2 passed, 2 failed, 0 skipped")
        self.assertIn("gate: FAILED test_x: its run ended before its last "
                      "test (crashed, killed or timed out)", lines)

    def test_a_file_failed_outside_its_methods_is_a_failure(self):
        self.results_file("test_x", "pass\ttest_x.A.test_1\nend\ttest_x\t1\n")
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
