"""Puts tests/support on sys.path, so that bench's modules can import
esitest, the test-support package tests/integration/harness.py uses too:
`import support_path` before `import esitest`."""

import os
import sys

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "tests", "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)
