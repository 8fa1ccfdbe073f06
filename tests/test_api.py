"""The Python API's namespace: every public name works in a fresh interpreter, and none is a module's name."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import testbed
from testbed import api
from testbed.studies import STUDIES

pytestmark = pytest.mark.exact
ROOT = Path(__file__).resolve().parent.parent
API_FUNCTIONS = [name for name in testbed.__all__ if callable(getattr(testbed, name)) and
                 not isinstance(getattr(testbed, name), type)]


def test_every_public_name_is_there_in_a_fresh_interpreter():
    code = ("import testbed, types\n"
            "for name in testbed.__all__:\n"
            "    value = getattr(testbed, name)\n"
            "    assert not isinstance(value, types.ModuleType), name\n"
            "import testbed.launch.launcher, testbed.scenario.config, testbed.studies\n"  # importing the packages
            "assert callable(testbed.run) and testbed.run.__module__ == 'testbed.api', testbed.run\n"  # changes nothing
            "print(len(testbed.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(len(testbed.__all__)), out.stderr


def test_no_public_name_is_a_module_or_subpackage():
    submodules = {info.name for info in pkgutil.iter_modules(testbed.__path__)}
    assert "launch" in submodules and "api" in submodules  # the check sees the package's own modules
    assert not submodules & set(testbed.__all__), submodules & set(testbed.__all__)
    assert not hasattr(testbed, "__getattr__") and not hasattr(api, "__getattr__")


def test_help_lists_the_api():
    out = subprocess.run([sys.executable, "-c", "import testbed; help(testbed)"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, env={"PAGER": "cat", "PATH": "/usr/bin:/bin"})
    for name in API_FUNCTIONS:
        assert f"\n    {name}(" in out.stdout, name


def test_every_built_in_study_has_its_function():
    """`testbed.<name>` for each study of the registry (the K-sweep study is sweep_k: `sweep` is one run)."""
    named = {("sweep_k" if name == "sweep" else name) for name in STUDIES}
    assert named <= set(API_FUNCTIONS), named - set(API_FUNCTIONS)
    for name in named:
        assert getattr(testbed, name).__doc__, name


def test_a_study_function_is_the_study_by_name():
    with pytest.raises(TypeError, match="unexpected option 'jitter'"):
        testbed.faults("geo-ring", jitter=3)
    assert testbed.whatif(model="llama-3.1-8b", hardware="h100-sxm", regions="ireland,virginia") == \
        testbed.study("whatif", model="llama-3.1-8b", hardware="h100-sxm", regions="ireland,virginia")
