"""The lab's presets: the random model each runs (moe-lab-model's options and the cached
file's name), its tokens, and the default ratios, configurations, budget and time limit."""

import os
from dataclasses import dataclass

# Real models' shapes at scale (moe-lab-model --shape; random_model.hpp's named_shapes).
SHAPES = ("qwen3-30b-a3b", "qwen3-30b-a3b-half")
# q4_K stores 256 weights in 144 bytes.
Q4K_BLOCK_WEIGHTS, Q4K_BLOCK_BYTES = 256, 144


@dataclass(frozen=True)
class Preset:
    name: str
    model_args: tuple  # moe-lab-model's options, but --out
    model_file: str  # its file under the lab's cache
    model_what: str  # for the log line that writes it
    embd: int
    expert_ff: int
    tokens: int  # prompt tokens
    decode: int
    ratios: str
    configs: str
    run_timeout: int  # seconds
    budget: str
    disk_reads: int  # 4 MiB reads per reader count of the disk curve (0: no disk measurements)
    slice_override: int = 0  # > 0: the expert slice's bytes (a trace's shape: its header says)

    @property
    def slice_bytes(self):
        """One expert slice of one expert tensor, bytes: the manager's request shape, at
        which the roofline's bandwidth is measured."""
        if self.slice_override:
            return self.slice_override
        return self.embd * self.expert_ff * Q4K_BLOCK_BYTES // Q4K_BLOCK_WEIGHTS


def _sized(name, layers, embd, expert_ff, tokens, decode, ratios, configs, run_timeout, budget, disk_reads):
    spec = ("--arch", "qwen3moe", "--layers", str(layers), "--experts", "128", "--k", "8", "--embd", str(embd),
            "--expert-ff", str(expert_ff), "--expert-type", "q4_K")
    return Preset(name, spec, f"qwen3moe-L{layers}-E128-k8-d{embd}-ff{expert_ff}-q4_K.gguf",
                  "random weights, q4_K experts from a pool of 32 per kind", embd, expert_ff, tokens, decode, ratios,
                  configs, run_timeout, budget, disk_reads)


PRESETS = {
    "full": _sized("full", 16, 2048, 768, 32, 64, "1.5,2.5",
                   "mmap,observer,dense,exact,predicted,cache,all,degraded,resident,resident-all,manager-exact,"
                   "manager-cache", 1800, "auto", 256),
    "quick": _sized("quick", 12, 1024, 512, 8, 16, "1.5,2.5",
                    "mmap,observer,dense,exact,predicted,cache,all,all-adaptive,degraded,resident,resident-all,"
                    "manager-exact,manager-cache", 600, "25%", 64),
    "smoke": _sized("smoke", 8, 1024, 512, 8, 12, "2", "mmap,all,all-serial,all-pool", 600, "25%", 0),
}


def shape_preset(shape):
    """The preset of a real model's shape (--shape NAME)."""
    return Preset("shape", ("--arch", "qwen3moe", "--shape", shape), f"{shape}-q4_K.gguf",
                  f"random weights in {shape}'s shape, q4_K experts from a pool of 32 per kind, q4_K dense rows "
                  "from a pool", 2048, 768, 8, 16, "2.0,1.5,3",
                  "mmap,mmap-128k,observer,dense,exact,predicted,cache,all,all-adaptive,all-pool,degraded,"
                  "degraded-pool,resident", 1800, "auto", 256)


# A recorded trace's shape (--shape-from): the ratios of the real-routing lab, and its
# configurations: the stock baselines, the manager without prediction, with the trace's
# oracle at a real model's accuracy (in the page cache and in the pool), and the bound.
TRACE_RATIOS = "1.5,2,3,4"
TRACE_CONFIGS = "mmap,mmap-128k,exact-cache,all-oracle,all-oracle-pool,resident"


def trace_preset(info, layers=0):
    """The preset of a model in a recorded trace's shape (moe-lab-model --shape-from), its
    first `layers` layers (0: all): the trace's prompt and decode tokens."""
    args = ("--shape-from", info.path) + (("--trace-layers", str(layers)) if layers else ())
    from .trace import model_file
    return Preset("trace", args, model_file(info, layers),
                  f"random weights in the shape of {os.path.basename(info.path)} ({info.arch}, "
                  f"{layers or info.n_layer} layers x {info.n_expert} experts, top-{info.top_k}; every layer's "
                  "expert bytes the trace's)", 0, 0, info.prompt_tokens, info.decode_tokens, TRACE_RATIOS,
                  TRACE_CONFIGS, 3600, "auto", 256, info.slice_bytes(layers))
