"""A recorded route trace as the lab needs it (route_trace v1 CSV, docs/traces.md): its
shape from the header, its prompt and decode token counts, and a name for the model
written in its shape. The lab only reads these; moe-lab-model and moe-lab-run read the
whole file with the library's own parser, which checks every row."""

import hashlib
import os
import re
from dataclasses import dataclass

from .log import die

_MAGIC = "# route_trace v1"
_MODEL_LINE = re.compile(r"^# model=.* arch=(\S+) n_layer=([0-9]+) n_expert=([0-9]+) n_expert_used=([0-9]+)\s*$")
_LAYER_LINE = re.compile(r"^# layer=([0-9]+) expert_bytes=([0-9]+) dense_bytes=([0-9]+)\s*$")


@dataclass(frozen=True)
class TraceInfo:
    path: str
    arch: str
    n_layer: int
    n_expert: int
    top_k: int
    expert_bytes: tuple  # per layer (0: dense or unlisted)
    prompt_tokens: int
    decode_tokens: int
    digest: str  # sha256 of the file, first 12 hex digits

    def slice_bytes(self, layers=0):
        """One expert slice (a third of the most common layer's expert: gate, up, down, in
        whole 4 KiB blocks, as O_DIRECT reads them), bytes: the manager's request shape, at
        which the roofline's bandwidth is measured."""
        used = [b for b in self.expert_bytes[:layers or self.n_layer] if b]
        common = max(set(used), key=used.count) if used else 0
        return max(4096, common // 3 // 4096 * 4096) if common else 0


def read(path, option):
    """The trace's header and token counts; refuses (naming `option` and the file) a file
    that is not a route_trace v1 CSV. Decode tokens are the distinct (turn, step) of the
    decode rows, prompt tokens those of the prompt rows."""
    if not os.path.isfile(path):
        die(f"{option}: '{path}' is not a file")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    try:
        with open(path, encoding="utf-8-sig") as f:
            first = f.readline().rstrip("\r\n")
            if first != _MAGIC:
                die(f"{option}: {path}: first line '{first[:40]}'; expected '{_MAGIC}' (a CSV route trace; "
                    "a binary one: moe-residency convert --to csv)")
            m = _MODEL_LINE.match(f.readline().rstrip("\r\n"))
            if not m:
                die(f"{option}: {path}: line 2 is not '# model=... arch=... n_layer=L n_expert=E n_expert_used=K'")
            arch, n_layer, n_expert, k = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            if not (1 <= n_layer <= 65535 and 1 <= n_expert <= 65535 and 1 <= k <= min(n_expert, 32)):
                die(f"{option}: {path}: {n_layer} layers x {n_expert} experts, top-{k}; expected layers and experts "
                    "in [1, 65535], top-k in [1, min(experts, 32)]")
            expert = [0] * n_layer
            prompt, decode = set(), set()
            for line in f:
                if line.startswith("#"):
                    lm = _LAYER_LINE.match(line.rstrip("\r\n"))
                    if lm and int(lm.group(1)) < n_layer:
                        expert[int(lm.group(1))] = int(lm.group(2))
                    continue
                fields = line.split(",", 4)
                if len(fields) < 4 or not fields[1].isdigit():
                    continue  # the column header
                (decode if fields[1] == "1" else prompt).add((fields[0], fields[2]))
    except UnicodeDecodeError:
        die(f"{option}: {path}: not UTF-8 text; expected a CSV route trace")
    if not decode:
        die(f"{option}: {path}: no decode rows; expected a trace of at least one decode token")
    return TraceInfo(path, arch, n_layer, n_expert, k, tuple(expert), len(prompt), len(decode), h.hexdigest()[:12])


def model_file(info, layers=0):
    """The name of the model written in the trace's shape (its first `layers` layers)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(info.path))
    stem = re.sub(r"\.(route\.)?csv$", "", stem)
    return f"trace-{stem}-{info.digest}{'-L%d' % layers if layers else ''}.gguf"
