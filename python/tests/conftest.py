"""Shared fixtures: the shared traces (../shared/traces or $MOE_RESIDENCY_TRACES) and the
moe-residency tool the results are compared with ($MOE_RESIDENCY_CLI; CTest sets both
paths). Without them the tests that need them skip loudly, and fail when CI=true."""

import os
import subprocess
import sys
import warnings

import pytest

SOURCE_DIR = os.environ.get("MOE_RESIDENCY_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
IN_CI = os.environ.get("CI") == "true"


def _missing(what):
    msg = "%s is missing: %s" % (what, "this fails under CI=true" if IN_CI else "SKIPPING the tests that need it")
    if IN_CI:
        pytest.fail(msg)
    print("\n*** " + msg + " ***", file=sys.stderr)
    warnings.warn(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def traces_dir():
    # $MOE_RESIDENCY_TRACES, else the build's MOE_RESIDENCY_TRACES_DIR (CTest passes it), else ../shared/traces
    d = (os.environ.get("MOE_RESIDENCY_TRACES") or os.environ.get("MOE_RESIDENCY_DEFAULT_TRACES")
         or os.path.join(SOURCE_DIR, "..", "shared", "traces"))
    if not os.path.isfile(os.path.join(d, "qwen.route.csv")):
        _missing("the shared traces (%s; set MOE_RESIDENCY_TRACES)" % d)
    return d


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("MOE_RESIDENCY_CLI")
    if not path or not os.access(path, os.X_OK):
        _missing("the moe-residency tool ($MOE_RESIDENCY_CLI = %r)" % path)

    def run(*args):
        p = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 0, "moe-residency %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr)
        return p.stdout
    return run


@pytest.fixture(scope="session", params=["qwen", "gptoss"])
def trace_name(request):
    return request.param


@pytest.fixture(scope="session")
def trace_path(traces_dir, trace_name):
    return os.path.join(traces_dir, trace_name + ".route.csv")
