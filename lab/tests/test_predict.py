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


class InLab(unittest.TestCase):
    """A test in a scratch directory holding lab/ (the runs and the model, `lab_layout`),
    predicting with the stand-in tool."""

    def setUp(self):
        self.cwd = os.getcwd()
        self.tmp = tempfile.mkdtemp(prefix="memlab-predict-")
        os.makedirs(os.path.join(self.tmp, "lab"))
        os.chdir(self.tmp)
        self.tool = os.path.join(DATA, "fake-moe-residency")
        self.lab_layout()

    def tearDown(self):
        os.chdir(self.cwd)
        shutil.rmtree(self.tmp)

    def predict_output(self, argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = predict.main(argv + ["--tool", self.tool, "--readaround-mib", "16"])
        self.assertEqual(rc, 0)
        return out.getvalue()


class Predict(InLab):
    def lab_layout(self):
        shutil.copytree(os.path.join(DATA, "runs"), os.path.join("lab", "runs"))
        # The model only for its size (the limits): a sparse file of the quick model's bytes.
        with open(os.path.join("lab", "model.gguf"), "wb") as f:
            f.truncate(1476526080)

    def run_predict(self, args):
        return self.predict_output(args)

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


class PredictRealRouting(InLab):
    """A real-routing run (--shape-from, preset trace): each manager cell's budget from its
    log (the manager's auto budget differs per ratio), the oracle cells at the oracle's
    accuracy, exact-cache-l1 and -l4 as exact-cache at their lanes under their own ids,
    calibrated on exact-cache@2, and --pairs ab naming the pairs the run has."""

    def lab_layout(self):
        d = self.run_dir = os.path.join("lab", "runs", "20261207-000000-trace")
        os.makedirs(d)
        with open(os.path.join("lab", "model.gguf"), "wb") as f:
            f.truncate(4 * 1048576 * 100)  # 400 MiB: limits 200 (ratio 2) and 100 (ratio 4)
        with open(os.path.join(d, "table.txt"), "w") as f:
            f.write("memlab (trace): model.gguf; routing forced from qwen.route.csv, 400 MiB; x\n")
        shutil.copy(os.path.join(DATA, "runs", "20261201-000000-quick", "disk-lanes.csv"), d)
        metrics = os.path.join(DATA, "runs", "20261201-000000-quick", "r2.5-exact.metrics.csv")
        budgets = {"exact-cache": (150.5, 70.25), "exact-cache-l1": (150.5, 70.25), "all-oracle": (150.5, 70.25),
                   "all-oracle-pool": (149, 69), "mmap-128k": (0, 0)}
        for name, (b2, b4) in budgets.items():
            for r, b in (("2", b2), ("4", b4)):
                if name == "exact-cache-l1" and r == "4":
                    continue  # a cell the run did not make
                cell = os.path.join(d, f"r{r}-{name}")
                with open(cell + ".status", "w") as f:
                    f.write("ok\n")
                shutil.copy(metrics, cell + ".metrics.csv")
                with open(cell + ".log", "w") as f:
                    f.write(f"residency: dense 12.5 MiB locked | cache lru {b} MiB 90.00% hit\n"
                            f"residency budget: limit {r}00.0 MiB (cgroup) - dense 12.5 MiB - llama.cpp anonymous "
                            f"5.0 MiB - margin 1.0 MiB = {b} MiB\n" if b else "stock\n")
        with open(os.path.join(d, "r2-exact-cache.route.csv"), "w") as f:
            f.write("a trace\n")

    def run_predict(self, args):
        return self.predict_output([self.run_dir] + args)

    def test_cells_and_pairs(self):
        out = self.run_predict(["--pairs", "ab", "--noise", "6"])
        d = self.run_dir
        m = lambda c: f"{d}/{c}.metrics.csv"  # noqa: E731
        self.assertEqual(out.split("--- cells\n")[1],
                         "ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics,lanes,label\n"
                         f"2,mmap-128k,200,0,100,{m('r2-mmap-128k')}\n"
                         f"2,exact-cache,200,150.5,100,{m('r2-exact-cache')}\n"
                         f"2,all-oracle,200,150.5,88.6,{m('r2-all-oracle')}\n"
                         f"2,all-oracle-pool,200,149,88.6,{m('r2-all-oracle-pool')}\n"
                         f"2,exact-cache,200,150.5,100,{m('r2-exact-cache-l1')},1,exact-cache-l1@2\n"
                         f"4,mmap-128k,100,0,100,{m('r4-mmap-128k')}\n"
                         f"4,exact-cache,100,70.25,100,{m('r4-exact-cache')}\n"
                         f"4,all-oracle,100,70.25,88.6,{m('r4-all-oracle')}\n"
                         f"4,all-oracle-pool,100,69,88.6,{m('r4-all-oracle-pool')}\n")
        args = out.split("--- cells\n")[0]
        self.assertIn("ARG[--fit]\nARG[exact-cache@2]\n", args)
        self.assertIn(f"ARG[--trace]\nARG[{d}/r2-exact-cache.route.csv]\n", args)
        self.assertIn("ARG[--pairs]\nARG[exact-cache@2:all-oracle@2,exact-cache-l1@2:exact-cache@2,"
                      "all-oracle@2:all-oracle-pool@2,mmap-128k@2:exact-cache@2,exact-cache@4:all-oracle@4,"
                      "all-oracle@4:all-oracle-pool@4,mmap-128k@4:exact-cache@4,exact-cache@2:exact-cache@4]\n", args)
        self.assertIn("ARG[--noise]\nARG[6]\n", args)
        self.assertIn("ARG[--dense-mib]\nARG[12.5]\n", args)  # the manager's dense, from a cell's log
        # A budget given is every manager cell's; the fit another cell.
        out = self.run_predict(["--budget", "50%", "--fit", "all-oracle@4"])
        self.assertIn("\n4,exact-cache,100,50,100,", out)
        self.assertIn("ARG[--fit]\nARG[all-oracle@4]\n", out)
        self.assertNotIn("ARG[--pairs]", out)

    def test_refusals(self):
        for args, message in ((["--noise", "a"], "--noise: 'a'; expected a percentage like 5"),):
            with self.subTest(args=args):
                with self.assertRaises(log.LabError) as e:
                    self.run_predict(args)
                self.assertIn(message, str(e.exception))

if __name__ == "__main__":
    unittest.main()
