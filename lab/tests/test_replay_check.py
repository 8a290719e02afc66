"""The replay check reads the manager's summary line as moe-lab-run prints it (its cache's
policy, budget, hit rate and missed MiB; its predictor and late reads), and refuses to
replay the stale gate's rankings, which no trace holds."""

import unittest

from memlab import replay_check as rc

LINE = ("residency: dense 951.4 MiB locked | exact 4081 reads 11178.1 MiB | predicted (oracle:0.886) issued 2816 "
        "useful 1027 late 462 wasted 1327 | cache lru 6694.3 MiB 92.30% hit (1234.5 MiB missed), pinned 6693.5 MiB "
        "(peak 6694.3 MiB) | resident at routing 95.88% | advice errors 0")


class SummaryLine(unittest.TestCase):
    def test_cache_and_predictor(self):
        m = rc._CACHE.search(LINE)
        self.assertEqual(m.groups(), ("lru", "6694.3", "92.30", "1234.5"))
        p = rc._PREDICTED.search(LINE)
        self.assertEqual(p.groups(), ("oracle:0.886", "2816", "1027", "462", "1327"))

    def test_the_spec_cap_of_a_configuration(self):
        self.assertEqual(rc._spec_cap("all-oracle"), "2")
        self.assertEqual(rc._spec_cap("all-oracle-pool"), "8")


if __name__ == "__main__":
    unittest.main()
