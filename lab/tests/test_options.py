"""The lab's command line and its configuration table: refusals naming the option, the
value and what was expected; each configuration's moe-lab-run options as the lab has
always run them; the degraded cells' share of wrong predictions."""

import os
import unittest

from memlab import configs as cfg
from memlab import log, options


def refusal(argv):
    try:
        options.parse(argv)
    except log.LabError as e:
        return str(e)
    return None


class Options(unittest.TestCase):
    def test_refusals(self):
        for argv, message in (
                (["--ratios", "0.5"], "--ratios: '0.5' in '0.5'; expected ratios of the model's size to the memory "
                                      "limit, from 1 to 100"),
                (["--ratios", "1.5,,2"], "--ratios: '1.5,,2'; expected a comma list of ratios like 1.5,2.5"),
                (["--threads", "0"], "--threads: '0'; expected a whole number from 1 to 1024"),
                (["--threads", "1025"], "--threads: '1025'; expected a whole number from 1 to 1024"),
                (["--budget", "100%"], "--budget: '100%'; expected MiB > 0, auto, or a share of the limit like 40% "
                                       "(above 0, below 100)"),
                (["--budget", "0"], "--budget: '0'; expected MiB > 0"),
                (["--configs", "mmap,fast"], "--configs: 'fast'; expected mmap, mmap-128k, no-mmap, mlock, observer, "
                                             "dense, exact, predicted, cache, all, all-adaptive, all-serial, all-pool, "
                                             "cache-pool, degraded, degraded-pool, exact-cache, exact-cache-l1, "
                                             "exact-cache-l4, all-oracle, "
                                             "all-oracle-pool, all-perfect, resident, resident-all, "
                                             "manager-exact or manager-cache"),
                (["--configs", "all-oracle"], "--configs: 'all-oracle' predicts from the trace's routing; expected "
                                              "--route-from TRACE (or --shape-from without --own-routing)"),
                (["--own-routing"], "--own-routing: only with --shape-from"),
                (["--trace-layers", "4"], "--trace-layers has no effect without --shape-from or --route-from"),
                (["--shape-from", "/nonexistent.csv"], "--shape-from: '/nonexistent.csv' is not a file"),
                (["--rounds", "0"], "--rounds: '0'; expected a whole number of rounds, at least 1"),
                (["--decode", "-3"], "--decode: '-3'; expected a whole number of decode tokens, at least 1"),
                (["--run-timeout", "1.5"], "--run-timeout: '1.5'; expected a whole number of seconds, at least 1"),
                (["--shape", "qwen3-31b"], "--shape: 'qwen3-31b'; expected qwen3-30b-a3b or qwen3-30b-a3b-half"),
                (["--degrade-to", "100"], "--degrade-to: '100'; expected the percentage"),
                (["--csv"], "--csv needs FILE"),
                (["--fast"], "unknown argument '--fast' (see --help)"),
                (["--warm-from", "0"], "--warm-from: '0'; expected a whole number of a decode token, at least 1"),
                (["--quick", "--warm-from", "17"], "--warm-from: '17'; expected a decode token from 1 to 16 "
                                                   "(--decode)"),
                (["--table-only", "/tmp", "--rounds", "2"], "--table-only: one round only")):
            with self.subTest(argv=argv):
                got = refusal(argv)
                self.assertIsNotNone(got, f"{argv} was not refused")
                self.assertTrue(got.startswith(message), got)

    def test_presets_and_their_defaults(self):
        s = options.parse(["--smoke"])
        self.assertEqual((s.preset.name, s.ratios, s.configs, s.budget, s.decode, s.run_timeout),
                         ("smoke", ["2"], ["mmap", "all", "all-serial", "all-pool"], "25%", 12, 600))
        s = options.parse(["--smoke", "--quick", "--decode", "64", "--ratios", "2.5", "--budget", "auto"])
        self.assertEqual((s.preset.name, s.ratios, s.budget, s.decode), ("quick", ["2.5"], "auto", 64))
        s = options.parse(["--shape", "qwen3-30b-a3b"])
        self.assertEqual((s.preset.model_file, s.ratios, s.preset.slice_bytes),
                         ("qwen3-30b-a3b-q4_K.gguf", ["2.0", "1.5", "3"], 2048 * 768 * 144 // 256))
        self.assertEqual(options.parse([]).preset.model_file, "qwen3moe-L16-E128-k8-d2048-ff768-q4_K.gguf")

    def test_a_traces_shape_and_routing(self):
        # A route trace written here: 3 layers (layer 2 q6_K-sized), 2 prompt and 3 decode tokens, top-2.
        import tempfile
        rows = ["# route_trace v1", "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=8 n_expert_used=2",
                "# layer=0 expert_bytes=110592 dense_bytes=0", "# layer=1 expert_bytes=110592 dense_bytes=0",
                "# layer=2 expert_bytes=127488 dense_bytes=0",
                "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes"]
        for layer in range(3):
            for step in range(2):
                rows += [f"0,0,{step},{layer},0,1,0.6,0,0", f"0,0,{step},{layer},1,2,0.4,0,0"]
        for step in range(2, 5):
            for layer in range(3):
                rows += [f"0,1,{step},{layer},0,3,0.6,0,0", f"0,1,{step},{layer},1,4,0.4,0,0"]
        with tempfile.NamedTemporaryFile("w", suffix=".route.csv", delete=False) as f:
            f.write("\n".join(rows) + "\n")
        try:
            s = options.parse(["--shape-from", f.name])
            self.assertEqual((s.preset.name, s.preset.tokens, s.preset.decode, s.decode, s.ratios),
                             ("trace", 2, 3, 3, ["1.5", "2", "3", "4"]))
            self.assertEqual(s.preset.model_args, ("--shape-from", f.name))
            self.assertEqual(s.preset.slice_bytes, 110592 // 3)  # the most common layer's third
            self.assertTrue(s.preset.model_file.startswith("trace-") and s.preset.model_file.endswith(".gguf"))
            self.assertEqual(s.forwarded("to_runs"), ["--route-from", f.name])  # its own routing, by default
            s = options.parse(["--shape-from", f.name, "--trace-layers", "2"])
            self.assertEqual(s.preset.model_args, ("--shape-from", f.name, "--trace-layers", "2"))
            self.assertTrue(s.preset.model_file.endswith("-L2.gguf"))
            self.assertEqual(s.forwarded("to_runs"), ["--route-from", f.name, "--trace-layers", "2"])
            s = options.parse(["--shape-from", f.name, "--own-routing", "--configs", "mmap,all"])
            self.assertEqual(s.forwarded("to_runs"), [])
            self.assertIsNone(s.route)
            self.assertEqual(refusal(["--shape-from", f.name, "--trace-layers", "4"]),
                             "--trace-layers: 4; expected at most the trace's 3 layers")
        finally:
            os.unlink(f.name)

    def test_forwarded_options_reach_every_run(self):
        self.assertEqual(options.parse(["--quick", "--threads", "3"]).forwarded("to_runs"), ["--threads", "3"])
        self.assertEqual(options.parse(["--quick"]).forwarded("to_model"), [])


class Configurations(unittest.TestCase):
    def test_each_configurations_options(self):
        # As the former scripts/memlab.sh's config_args gave them, at a 563 MiB limit and a 25% budget.
        expected = {
            "mmap": "--no-observer", "mmap-128k": "--no-observer", "no-mmap": "--no-observer --load-mode no-mmap",
            "mlock": "--no-observer --load-mode mlock", "observer": "",
            "dense": "--residency dense --residency-budget 141", "exact": "--residency exact --residency-budget 141",
            "predicted": "--residency predicted --residency-budget 141",
            "cache": "--residency cache --residency-budget 141", "all": "--residency all --residency-budget 141",
            "all-adaptive": "--residency all --residency-budget 141 --policy adaptive",
            "all-serial": "--residency all --residency-budget 141 --serial",
            "all-pool": "--residency all --residency-budget 141 --pool --spec-cap 8",
            "cache-pool": "--residency cache --residency-budget 141 --pool",
            "degraded": "--residency all --residency-budget 141 --degrade 0.0564",
            "degraded-pool": "--residency all --residency-budget 141 --pool --spec-cap 8 --degrade 0.0564",
            "exact-cache": "--residency dense,exact,cache --residency-budget 141",
            "exact-cache-l1": "--residency dense,exact,cache --residency-budget 141 --lanes 1",
            "exact-cache-l4": "--residency dense,exact,cache --residency-budget 141 --lanes 4",
            "all-oracle": "--residency all --residency-budget 141 --predictor oracle:0.886",
            "all-oracle-pool": "--residency all --residency-budget 141 --pool --spec-cap 8 --predictor oracle:0.886",
            "all-perfect": "--residency all --residency-budget 141 --predictor oracle:1",
            "resident": "--no-observer", "resident-all": "--residency all --residency-budget auto",
            "manager-exact": "--residency exact --residency-budget 141 --residency-when-fits act",
            "manager-cache": "--residency cache --residency-budget 141 --residency-when-fits act"}
        self.assertEqual([c.name for c in cfg.CONFIGS], list(expected))
        for c in cfg.CONFIGS:
            self.assertEqual(" ".join(cfg.run_args(c, "25%", 563, "0.0564")), expected[c.name], c.name)
        self.assertEqual(cfg.run_args(cfg.BY_NAME["all"], "auto", 563), ["--residency", "all", "--residency-budget",
                                                                          "auto"])
        self.assertEqual(cfg.run_args(cfg.BY_NAME["all"], "300", 563)[-1], "300")
        self.assertEqual({c.name for c in cfg.CONFIGS if not c.limited},
                         {"resident", "resident-all", "manager-exact", "manager-cache"})

    def test_degrade_share(self):
        # acc x (1 - P) = 88.6: P = 1 - 88.6 / acc, 4 decimals, never below 0.
        self.assertEqual(cfg.degrade_share(93.9), "%.4f" % (1 - 88.6 / 93.9))
        self.assertEqual(cfg.degrade_share(93.9), "0.0564")
        self.assertEqual(cfg.degrade_share(80.0), "0.0000")
        self.assertEqual(cfg.degrade_share(93.9, 50.0), "0.4675")
        self.assertEqual(cfg.REAL_STALE_GATE_PCT, 88.6)  # the seed engine's on a real Qwen3-30B-A3B

    def test_cell_budget(self):
        self.assertEqual(cfg.cell_budget("25%", 563), "141")  # 140.75
        self.assertEqual(cfg.cell_budget("25%", 939), "235")
        self.assertEqual(cfg.cell_budget("auto", 939), "auto")


class OpenMP(unittest.TestCase):
    def test_a_short_spin_unless_the_environment_names_a_wait(self):
        from memlab.runner import openmp_environment
        self.assertEqual(openmp_environment({}), ({"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "1"},
                                                  "GOMP_SPINCOUNT=1000"))
        self.assertEqual(openmp_environment({"OMP_WAIT_POLICY": "PASSIVE"}), ({}, "OMP_WAIT_POLICY=PASSIVE"))
        self.assertEqual(openmp_environment({"GOMP_SPINCOUNT": "0", "KMP_BLOCKTIME": "5", "HOME": "/"}),
                         ({}, "GOMP_SPINCOUNT=0 KMP_BLOCKTIME=5"))

    def test_background_load_is_bounded_and_counted(self):
        self.assertEqual(options.parse(["--quick", "--background-load", "2"]).given["background_load"], "2")
        self.assertEqual("--background-load: '65'; expected a whole number of busy processes from 0 to 64", refusal(["--quick", "--background-load", "65"]))


if __name__ == "__main__":
    unittest.main()
