"""The memory lab: stock llama.cpp decoding a Mixture-of-Experts GGUF larger than its
memory limit, through plain mmap and with the residency manager's parts, side by side
(docs/memlab.md), and the timing model against its runs (docs/lab-predict.md).

One program in Python 3 with numpy: the driver (runner), its statistics (stats), the
table (table), the rounds' pooling (rundir), the plots (plots, gnuplot fed with data
files) and the prediction (predict). What needs root — the memory cgroup, the page
cache, a device's read-ahead — is lab/memlab.sh's, a short shell wrapper (root)."""
