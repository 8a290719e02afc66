"""Builds the moe_residency Python module (python/src, the headers in include/) with
pybind11's setuptools helpers. Metadata lives here, not in pyproject.toml, because the
version is read from include/moe_residency/version.hpp, the one place it is kept.
See docs/python.md for the install command."""

import glob
import os
import re
import shutil
import subprocess

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    text = open(os.path.join(HERE, "include", "moe_residency", "version.hpp")).read()
    parts = [re.search(r"#define MOE_RESIDENCY_VERSION_%s (\d+)" % p, text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def eigen_include():
    """The calibration's Eigen (Debian: libeigen3-dev), found by pkg-config when it can be."""
    if shutil.which("pkg-config"):
        p = subprocess.run(["pkg-config", "--cflags-only-I", "eigen3"], capture_output=True, text=True)
        dirs = [f[2:] for f in p.stdout.split() if f.startswith("-I")]
        if p.returncode == 0 and dirs:
            return dirs
    for d in ("/usr/include/eigen3", "/usr/local/include/eigen3", "/opt/homebrew/include/eigen3"):
        if os.path.isdir(d):
            return [d]
    raise SystemExit("moe_residency: Eigen 3 not found (Debian: apt-get install libeigen3-dev; "
                     "or set CPPFLAGS=-I<dir with Eigen/Dense>)")


ParallelCompile("NPY_NUM_BUILD_JOBS", default=0).install()  # one compiler per core

setup(
    name="moe_residency",
    version=version(),
    description="Replay, score and time Mixture-of-Experts expert residency policies on recorded routing",
    license="MIT",
    packages=["moe_residency"],
    package_dir={"": "python"},
    ext_modules=[Pybind11Extension("moe_residency._core", sorted(glob.glob("python/src/*.cpp")),
                                   include_dirs=["include", "python/src"] + eigen_include(), cxx_std=17)],
    cmdclass={"build_ext": build_ext},
    install_requires=["numpy"],
    python_requires=">=3.8",
)
