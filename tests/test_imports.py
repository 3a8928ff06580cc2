"""Packaging: every module under the mapped folders imports as infopt.*, and --help stays light."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import infopt

PACKAGES = ["infopt", "infopt.core", "infopt.runtime", "infopt.passes", "infopt.quantize", "infopt.kernels", "infopt.exporters",
            "infopt.validators", "infopt.recipes"]


def all_modules() -> list[str]:
    names = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names.append(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if info.name.endswith("__main__"):
                continue
            names.append(info.name)
    return sorted(set(names))


def test_walk_finds_every_folder():
    found = all_modules()
    for expected in ("infopt.api.orchestrator", "infopt.cli.app", "infopt.core.errors", "infopt.runtime.backends.onnxruntime",
                     "infopt.passes.fx.fold_batchnorm", "infopt.passes.lower.onnx_export",
                     "infopt.exporters.servers.triton", "infopt.validators.metrics"):
        assert expected in found


@pytest.mark.parametrize("name", all_modules())
def test_module_imports(name):
    module = importlib.import_module(name)
    assert module.__name__ == name


ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    """pyproject.toml's ``[tool.setuptools]``: the packages and the folder each is read from."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, str]:
    return _setuptools()["package-dir"]


def test_no_top_level_modules_leak():
    """infopt installs one top-level name, ``infopt``: none of its source folders becomes a module of its own."""
    import importlib.metadata

    installs = importlib.metadata.packages_distributions()
    for folder in _package_folders().values():
        assert "infopt" not in installs.get(folder, []), folder
    assert "infopt" in installs.get("infopt", [])


def test_no_source_folder_shadows_an_installed_module():
    """The checkout's root is on ``sys.path`` in the tests, so a source folder named like an installed module hides
    that module from everything that imports it: ``kernels/`` hid Hugging Face's ``kernels``, which transformers
    imports, and every transformers model failed to load."""
    import importlib.metadata

    installs = importlib.metadata.packages_distributions()
    clashes = {folder: installs[folder] for folder in _package_folders().values() if folder in installs}
    assert not clashes, f"source folders named like installed modules: {clashes}"


def test_recipes_are_package_data():
    from infopt.recipes import PIPELINES_DIR, TARGETS_FILE

    assert TARGETS_FILE.is_file()
    assert list(PIPELINES_DIR.glob("*.yaml"))


def test_help_does_not_import_torch():
    code = ("import sys\nsys.argv=['infopt','--help']\nfrom infopt.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy=[m for m in ('torch','onnx','onnxruntime','numpy') if m in sys.modules]\nprint('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "Usage" in out.stdout
    assert "HEAVY []" in out.stdout, out.stdout[-300:]


def test_version_attribute():
    assert isinstance(infopt.__version__, str) and infopt.__version__


def test_every_package_folder_is_in_the_wheel():
    """A folder with an ``__init__.py`` that pyproject.toml does not list would be left out of a
    built wheel while an editable install still finds it."""
    config = _setuptools()
    listed = set(config["packages"])
    for package, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *parts)) in listed, f"{init.parent} is not in pyproject.toml's packages"
