"""A module built for another NGINX is refused by NGINX itself at
load_module, never loaded half-way: tests/build-matrix.sh sets
ESI_MATRIX_FOREIGN to modules built for the version before the newest and
for the newest without --with-compat, and runs this against the newest
nginx (nginx.org's arguments, --with-compat).  Skipped anywhere else."""

import os
import re
import subprocess
import unittest

from harness import NGINX, EsiTestCase

FOREIGN = os.environ.get("ESI_MATRIX_FOREIGN", "").split()

CONF = """
load_module %s;
events {}
http {}
"""


@unittest.skipUnless(FOREIGN, "run by tests/build-matrix.sh for the newest "
                     "nginx")
class ForeignModuleTest(EsiTestCase):
    ESID = False

    def nginx_t(self, module):
        conf = os.path.join(self.tmp, "abi.conf")
        with open(conf, "w") as f:
            f.write(CONF % module)
        r = subprocess.run(
            [NGINX, "-t", "-p", self.tmp + "/", "-e",
             os.path.join(self.tmp, "abi.log"), "-c", conf],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        return r.returncode, r.stderr.decode()

    def test_a_module_of_another_version_is_refused_naming_both(self):
        older = FOREIGN[0]
        code, out = self.nginx_t(older)
        self.assertNotEqual(code, 0, out)
        self.assertRegex(out, r'\[emerg\] module "%s" version \d+ instead '
                         r'of \d+' % re.escape(older))

    def test_a_module_without_compat_is_refused_as_incompatible(self):
        nocompat = FOREIGN[1]
        code, out = self.nginx_t(nocompat)
        self.assertNotEqual(code, 0, out)
        self.assertIn('[emerg] module "%s" is not binary compatible'
                      % nocompat, out)


if __name__ == "__main__":
    unittest.main()
