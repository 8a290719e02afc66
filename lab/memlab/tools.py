"""The lab's tools (lab/llama_cpp: moe-lab-run, moe-lab-model, moe-disk-lanes): built
once in build/memlab (Release, against the llama.cpp of scripts/fetch-llama-cpp.sh
--install), or taken from a directory (--tools); and the lab's model, written once."""

import os
import subprocess
import sys
from dataclasses import dataclass

from .log import die, log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGETS = ("moe_lab_run", "moe_lab_model", "moe_disk_lanes", "moe_residency_cli")


@dataclass(frozen=True)
class Tools:
    run: str  # moe-lab-run
    model: str  # moe-lab-model
    lanes: str  # moe-disk-lanes ('' if absent: no disk measurements)
    cli: str = ""  # moe-residency ('' if absent: no replay check)


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def in_directory(d):
    """The tools in `d`; moe-disk-lanes may be missing."""
    run, model, lanes, cli = (os.path.join(d, n) for n in ("moe-lab-run", "moe-lab-model", "moe-disk-lanes",
                                                            "moe-residency"))
    for path in (run, model):
        if not _executable(path):
            die(f"--tools: '{d}' has no executable {os.path.basename(path)}")
    return Tools(run, model, lanes if _executable(lanes) else "", cli if _executable(cli) else "")


def build():
    """The tools built in build/memlab (Release)."""
    log("building moe-lab-run, moe-lab-model, moe-disk-lanes and moe-residency (build/memlab, Release)")
    prefix = subprocess.run([os.path.join(REPO, "scripts", "fetch-llama-cpp.sh"), "--install"], check=True, text=True,
                            stdout=subprocess.PIPE).stdout.strip()
    build_dir = os.path.join(REPO, "build", "memlab")
    subprocess.run(["cmake", "-S", REPO, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DMOE_RESIDENCY_BUILD_LLAMA_CPP=ON", "-DMOE_RESIDENCY_TEST_CONSUMER=OFF",
                    f"-DCMAKE_PREFIX_PATH={prefix}"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build_dir, "-j2", "--target", *TARGETS], check=True, stdout=sys.stderr)
    return in_directory(os.path.join(build_dir, "bin"))


def ensure_model(tools, preset, path):
    """The preset's model at `path`, written by moe-lab-model if it is not there yet
    (written as path.part and renamed, so an interrupted write leaves no model)."""
    if os.path.isfile(path):
        return
    log(f"writing the lab model {path} ({preset.model_what})")
    r = subprocess.run([tools.model, *preset.model_args, "--out", path], check=False, stdout=sys.stderr)
    if r.returncode != 0:
        die(f"moe-lab-model exited with {r.returncode} writing {path}")
