"""Every Python block of docs/python.md and README.md runs as written (blocks of a page
share one namespace, in order), on the shared traces, in a scratch directory."""

import os
import re

import pytest

from conftest import SOURCE_DIR


def python_blocks(page):
    with open(os.path.join(SOURCE_DIR, page)) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("page", ["docs/python.md", "README.md"])
def test_blocks_run(page, traces_dir, tmp_path, monkeypatch, capsys):
    blocks = python_blocks(page)
    assert blocks, "%s has no python block" % page
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs"}
    for i, code in enumerate(blocks):
        code = code.replace("../shared/traces", traces_dir)
        exec(compile(code, "%s, python block %d" % (page, i + 1), "exec"), namespace)
    out = capsys.readouterr().out
    if page == "docs/python.md":
        # the figures the page states in its comments
        lines = out.splitlines()
        for shown in ("<ModelShape qwen3moe: 48 layers (48 MoE), 128 experts, top-6>", "44766 128", "80.3",
                      "38.0"):
            assert shown in lines, shown   # a whole line, as the page's comments say
        assert any(ln.endswith(" 784.7") for ln in lines)
        assert any(ln.startswith("<WhatIf lru at 2000 MiB: ") for ln in lines)
