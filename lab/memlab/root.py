"""The root steps, done by lab/memlab.sh (the shell wrapper that created the memory
cgroup this invocation runs in, and whose exit trap undoes them): the cgroup's limit, a
command moved into the cgroup, the page cache dropped, a device's read-ahead set and
restored. What is read without root (the cgroup's peak, its version) is read here."""

import os
import re
import subprocess

from .log import die

CGROUP_ROOTS = {"1": "/sys/fs/cgroup/memory", "2": "/sys/fs/cgroup"}


def cgroup_version():
    """'2' (v2 with the memory controller at /sys/fs/cgroup), '1' (the v1 memory
    controller at /sys/fs/cgroup/memory) or '' (neither)."""
    if os.path.isfile("/sys/fs/cgroup/cgroup.controllers"):
        return "2"
    if os.path.isfile("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        return "1"
    return ""


class RootSteps:
    """The wrapper's root steps for this invocation (its environment names them)."""

    def __init__(self, env=os.environ):
        self.wrapper = env.get("MEMLAB_ROOT_STEP", "")
        self.cgroup = env.get("MEMLAB_CGROUP", "")
        self.version = env.get("MEMLAB_CGROUP_VERSION", "")
        if not (self.wrapper and self.cgroup and self.version):
            die("the lab's runs need root steps (a memory cgroup, the page cache dropped): run it as "
                "'sudo lab/memlab.sh ...', which makes them and undoes them on exit")
        root = CGROUP_ROOTS.get(self.version, "")
        if not re.fullmatch(re.escape(root) + r"/moe-residency-memlab-[0-9]+", self.cgroup):
            die(f"MEMLAB_CGROUP: '{self.cgroup}'; expected {root}/moe-residency-memlab-<pid> (lab/memlab.sh's)")

    def _step(self, *args):
        return subprocess.run([self.wrapper, "--root-step", *args], check=False, text=True, stdout=subprocess.PIPE)

    def _must(self, *args):
        r = self._step(*args)
        if r.returncode != 0:
            die(f"root step '{' '.join(args)}' failed (exit {r.returncode})")
        return r.stdout

    def limit(self, limit_bytes):
        """The cgroup's memory limit, bytes; None: no limit."""
        self._must("limit", "none" if limit_bytes is None else str(int(limit_bytes)))

    def drop_caches(self):
        """sync; the machine's clean page cache dropped."""
        self._must("drop-caches")

    def read_ahead(self, model, kb):
        """The read_ahead_kb of the device holding `model` set to `kb` (the wrapper keeps
        the old value and restores it on exit): 'FILE OLD', or '' where no writable
        read_ahead_kb was found."""
        r = self._step("read-ahead", model, str(int(kb)))
        if r.returncode == 3:
            return ""
        if r.returncode != 0:
            die(f"root step 'read-ahead {model} {kb}' failed (exit {r.returncode})")
        return r.stdout.strip()

    def restore_read_ahead(self):
        self._must("read-ahead-restore")

    def in_cgroup(self, argv):
        """`argv` as a command that moves itself into the cgroup, then runs."""
        return [self.wrapper, "--root-step", "in-cgroup", "--", *argv]

    def peak_mib(self):
        """The cgroup's peak usage since its limit was last set, MiB; '-' if unreadable."""
        name = "memory.max_usage_in_bytes" if self.version == "1" else "memory.peak"
        try:
            with open(os.path.join(self.cgroup, name)) as f:
                return "%.0f" % (int(f.read().split()[0]) / 1048576)
        except (OSError, ValueError, IndexError):
            return "-"
