"""`memlab predict` against what the former scripts/memlab-predict.sh printed for the same
runs (data/predict: two fixture runs of a quick preset, a stand-in for moe-residency
lab-predict that prints its arguments and the cells file, or a prediction CSV): the
arguments, the cells file (limits, budgets, stale-gate accuracies, metrics joined), the
mean disk curve, the walks, the manager's runs, --pool, --fit-run, --sweep and --repeats."""

import contextlib
import io
import os
import shutil
import tempfile
import unittest

from memlab import log, predict

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "predict")
A, B = "lab/runs/20261201-000000-quick", "lab/runs/20261202-000000-quick"
CASES = [  # the Nth is expected/N.out
    [A],
    [A, "--fit", "cache@2.5", "--format", "csv"],
    [A, "--repeats", B],
    [A, "--repeats", B, "--format", "csv", "--fit", "all@1.5"],
    [A, "--pool", B, "--budget", "40%", "--free", "compute,bandwidth", "--fault-bandwidth-scale", "1.2"],
    [A, "--sweep"],
    [A, "--fit-run", B, "--no-fault-walk", "--no-inline-walk"],
    [A, "--fault-walk", f"{B}/fault-walk.csv", "--inline-walk", f"{B}/inline-walk.csv", "--no-manager-cost",
     "--overhead-mib", "80"],
]


class Predict(unittest.TestCase):
    def setUp(self):
        self.cwd = os.getcwd()
        self.tmp = tempfile.mkdtemp(prefix="memlab-predict-")
        shutil.copytree(os.path.join(DATA, "runs"), os.path.join(self.tmp, "lab", "runs"))
        # The model only for its size (the limits): a sparse file of the quick model's bytes.
        with open(os.path.join(self.tmp, "lab", "model.gguf"), "wb") as f:
            f.truncate(1476526080)
        os.chdir(self.tmp)
        self.tool = os.path.join(DATA, "fake-moe-residency")

    def tearDown(self):
        os.chdir(self.cwd)
        shutil.rmtree(self.tmp)

    def run_predict(self, args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = predict.main(args + ["--tool", self.tool, "--readaround-mib", "16"])
        self.assertEqual(rc, 0)
        return out.getvalue()

    def test_as_the_former_script(self):
        for i, case in enumerate(CASES, start=1):
            with self.subTest(case=" ".join(case)):
                with open(os.path.join(DATA, "expected", f"{i}.out")) as f:
                    self.assertEqual(self.run_predict(case), f.read())

    def test_refusals_name_the_input(self):
        for args, message in (
                (["lab/runs/none"], "RUNS_DIR: 'lab/runs/none' is not a directory"),
                ([A, B], f"one RUNS_DIR only ('{A}', '{B}')"),
                ([A, "--repeats", B, "--sweep"], "--repeats and --sweep together are not supported"),
                ([A, "--fault-walk", "nowhere.csv"], "--fault-walk: 'nowhere.csv' is not a file"),
                ([A, "--format", "json"], "--format: 'json'; expected table or csv"),
                ([A, "--fit", "cache@1.5", "--fit-run", B], f"--fit-run: no finished cache@1.5 in {B}")):
            with self.subTest(args=args):
                with self.assertRaises(log.LabError) as e:
                    self.run_predict(args)
                self.assertIn(message, str(e.exception))


if __name__ == "__main__":
    unittest.main()
