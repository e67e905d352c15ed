"""tfplace installed as a package (a wheel in site-packages), not run from the checkout.

The unit tests check the path rules in the checkout; the wheel test builds the wheel from a copy of
the sources, installs it into a temporary folder and runs commands from outside the repository, as
a user who installed it would. What it guards:
  * every file the code reads at runtime is in the wheel (bundled clusters, shipped bundles);
  * nothing is written into the installed package (zoo bundles exported on demand go to the cache);
  * a wheel built in a checkout ships the committed zoo bundles only, not the ones exported there.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfplace.formats import files

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
SOURCES = ("tfplace", "simulator", "policy", "baselines", "graph_defs", "clusters")


# ---- path rules, in the checkout ----------------------------------------------------------------

def test_bundled_root_is_the_package_when_it_holds_clusters(tmp_path):
    installed = tmp_path / "site" / "tfplace"
    (installed / "clusters").mkdir(parents=True)
    assert files.bundled_root(str(installed)) == str(installed)  # an installed copy: tfplace/clusters/
    checkout = tmp_path / "repo" / "tfplace"
    checkout.mkdir(parents=True)
    assert files.bundled_root(str(checkout)) == str(tmp_path / "repo")  # a checkout: clusters/ beside tfplace/
    assert os.path.isfile(os.path.join(files.bundled_root(), "clusters", "heterog_testbed.json"))


def test_a_missing_relative_path_naming_a_bundled_cluster_gets_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout: command-line paths resolve against the cwd only
    problem, fix = files.input_problem("clusters/local_cpu.json")
    assert problem == "file not found"
    assert os.path.join(files.bundled_root(), "clusters", "local_cpu.json") in fix
    assert files.input_problem("clusters/no_such.json") == ("file not found", "check the path")


def test_zoo_exports_go_to_the_cache_when_installed(tmp_path, monkeypatch):
    from tfplace.graph_defs import export
    monkeypatch.setenv("TFPLACE_CACHE", str(tmp_path / "cache"))
    assert not export.INSTALLED  # this test runs from the checkout
    assert export.export_dir(installed=False) == export.ZOO_DIR
    assert export.export_dir(installed=True) == str(tmp_path / "cache" / "zoo")


# ---- the wheel, installed -----------------------------------------------------------------------

def _pip_can_build():
    try:
        import setuptools  # noqa: F401  (--no-build-isolation builds with this environment's)
    except ImportError:
        return False
    return os.path.isfile(os.path.join(REPO, "setup.py"))


def _files(folder):
    """Every file under `folder`, relative, but Python's and numba's caches (written beside the
    code by design, and only where the folder is writable)."""
    out = set()
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out |= {os.path.relpath(os.path.join(root, f), folder) for f in files}
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site folder, environment) of a wheel built from a copy of the sources and installed there."""
    if not _pip_can_build():
        pytest.skip("needs setup.py (a checkout, not Bazel's runfiles) and setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in SOURCES:
        shutil.copytree(os.path.join(REPO, folder), src / folder, ignore=ignore)
    shutil.copy(os.path.join(REPO, "setup.py"), src)
    # a bundle exported on demand in the checkout (git-ignored): never shipped
    for suffix in ("json", "pb"):
        (src / "graph_defs" / "zoo" / f"tiny_mlp_b999_sgd.{suffix}").write_text("{}")
    build = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(build + ["wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(tmp / "whl")],
                   check=True, capture_output=True, timeout=300)
    (wheel_path,) = (tmp / "whl").iterdir()
    subprocess.run(build + ["install", "--no-deps", "-q", "--target", str(tmp / "site"), str(wheel_path)],
                   check=True, capture_output=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=str(tmp / "site"), TFPLACE_CACHE=str(tmp / "cache"))
    (tmp / "work").mkdir()
    return tmp, env


def _run(tmp, env, *args):
    return subprocess.run([sys.executable, *args], cwd=tmp / "work", env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_ships_bundled_data_and_only_committed_zoo_bundles(installed):
    tmp, _ = installed
    package = tmp / "site" / "tfplace"
    files = _files(package)
    assert "clusters/heterog_testbed.json" in files and "clusters/local_cpu.json" in files
    assert "policy/pretrained/policy.json" in files and "policy/split.json" in files
    assert "rewrite/grappler_plugin.cc" in files
    with open(os.path.join(REPO, "graph_defs", "manifest.json")) as f:
        committed = {m["stem"] for m in json.load(f)["models"] if m["committed"]}
    zoo = {os.path.splitext(p[len("graph_defs/zoo/"):])[0] for p in files if p.startswith("graph_defs/zoo/")}
    assert zoo == committed


@pytest.mark.slow
def test_an_installed_copy_runs_from_outside_the_checkout_and_never_writes_into_itself(installed):
    tmp, env = installed
    package = tmp / "site" / "tfplace"
    before = _files(package)
    where = _run(tmp, env, "-c", "import tfplace; print(tfplace.__file__)")
    assert where.stdout.strip() == str(package / "__init__.py"), where.stderr[-2000:]
    # a zoo model at a batch size no shipped bundle has: exported on demand, into the cache
    plan = _run(tmp, env, "-m", "tfplace.plan", "--model", "tiny_mlp", "--batch_size", "8",
                "--cluster", str(package / "clusters" / "two_kind_4gpu.json"), "--out", "s.json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert (tmp / "cache" / "zoo" / "tiny_mlp_b8_sgd.json").is_file()
    # a config names a bundled cluster as the docs do ("clusters/..."): found in the installed copy
    (tmp / "work" / "c.json").write_text(json.dumps({
        "format": "tfplace.train_config", "version": 1, "graphs": [{"model": "tiny_mlp", "batch_size": 16}],
        "clusters": ["clusters/heterog_testbed.json"]}))
    config = _run(tmp, env, "-c", "from tfplace.formats.config import load_train_config as l; "
                  "print(l('c.json').clusters[0])")
    assert config.stdout.strip() == str(package / "clusters" / "heterog_testbed.json"), config.stderr[-2000:]
    assert _files(package) == before
