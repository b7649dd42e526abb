"""Tests of bootstrap/sitecustomize.py, each in a fresh interpreter started the
way `dynaflow trace` starts Python: the bootstrap first on PYTHONPATH.

Tests that import torch are skipped when this Python has no torch; the one
that loads the real extension needs env DYNAFLOW_TORCH_EXT_BUILT (ctest sets
it when the extension is built).
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BOOTSTRAP = os.path.join(HERE, "bootstrap")
HAS_TORCH = importlib.util.find_spec("torch") is not None
BUILT_EXTENSION = os.environ.get("DYNAFLOW_TORCH_EXT_BUILT", "")


def run_python(code, extra_path=(), **env):
    """Runs `code` under the bootstrap; returns (exit code, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("DYNAFLOW_") and k not in ("PYTHONPATH", "LD_PRELOAD")}
    environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP, *extra_path])
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


class BootstrapTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def write(self, relative, text):
        path = os.path.join(self.tmp, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))

    def test_runs_the_sitecustomize_it_shadows(self):
        self.write("sitecustomize.py", "print('shadowed sitecustomize ran')\n")
        code, out, err = run_python("print('main')", [self.tmp])
        self.assertEqual((code, out, err), (0, "shadowed sitecustomize ran\nmain\n", ""))

    def test_a_failing_shadowed_sitecustomize_costs_one_line(self):
        self.write("sitecustomize.py", "raise ValueError('broken')\n")
        code, out, err = run_python("print('main')", [self.tmp])
        self.assertEqual((code, out), (0, "main\n"))
        self.assertEqual(len(err.splitlines()), 1)
        self.assertRegex(err, r"^dynaflow: error in .*sitecustomize\.py: ValueError\('broken'\)")

    def test_a_program_without_torch_never_loads_it(self):
        code, out, err = run_python(
            "import sys, json; print('torch' in sys.modules, "
            "[type(f).__name__ for f in sys.meta_path][0])")
        self.assertEqual((code, out, err), (0, "False _TorchImportWatcher\n", ""))

    def test_a_failing_torch_import_fails_as_without_the_bootstrap(self):
        self.write("torch/__init__.py", "raise ImportError('no torch here')\n")
        code, out, err = run_python(
            "try:\n  import torch\nexcept ImportError as e:\n  print('caught', e)",
            [self.tmp])
        self.assertEqual((code, out, err), (0, "caught no torch here\n", ""))

    def test_the_hook_runs_after_torch_init_once_it_is_complete(self):
        # A stand-in torch: the hook must see its module fully initialised and
        # with its own loader, and report the missing extension in one line.
        self.write("torch/__init__.py", "__version__ = '9.9.9'\nready = True\n")
        code, out, err = run_python(
            "import torch; print(torch.ready, type(torch.__loader__).__name__)", [self.tmp])
        self.assertEqual((code, out), (0, "True SourceFileLoader\n"))
        self.assertEqual(err, "dynaflow: no torch extension (DYNAFLOW_TORCH_EXT is not set); "
                              "operators are not recorded\n")

    def test_ops_off_skips_everything(self):
        self.write("torch/__init__.py", "__version__ = '9.9.9'\n")
        code, out, err = run_python("import torch; print('ok')", [self.tmp], DYNAFLOW_OPS="off")
        self.assertEqual((code, out, err), (0, "ok\n", ""))

    @unittest.skipUnless(HAS_TORCH, "this Python has no torch")
    def test_an_unloadable_extension_costs_one_line(self):
        code, out, err = run_python("import torch; print('ok')",
                                    DYNAFLOW_TORCH_EXT=os.path.join(self.tmp, "missing.so"))
        self.assertEqual((code, out), (0, "ok\n"))
        self.assertEqual(len(err.splitlines()), 1)
        self.assertRegex(err, r"^dynaflow: cannot load .*missing\.so.*operators are not recorded")

    @unittest.skipUnless(HAS_TORCH and BUILT_EXTENSION, "needs torch and the built extension")
    def test_without_the_tracer_the_extension_records_nothing(self):
        code, out, err = run_python("import torch; print(torch.ones(2).sum().item())",
                                    DYNAFLOW_TORCH_EXT=BUILT_EXTENSION)
        self.assertEqual((code, out), (0, "2.0\n"))
        self.assertEqual(err, "dynaflow: the dynaflow tracer is not loaded in this process; "
                              "operators are not recorded\n")

    @unittest.skipUnless(HAS_TORCH and BUILT_EXTENSION, "needs torch and the built extension")
    def test_torch_imported_by_the_shadowed_sitecustomize(self):
        self.write("sitecustomize.py", "import torch\n")
        code, out, err = run_python("print('main')", [self.tmp],
                                    DYNAFLOW_TORCH_EXT=BUILT_EXTENSION)
        self.assertEqual((code, out), (0, "main\n"))
        self.assertIn("tracer is not loaded", err)


if __name__ == "__main__":
    unittest.main()
