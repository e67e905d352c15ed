"""The layout contract: folders, one import root, and who may import whom.

Import rules are checked on the source (every `import tfplace...` / `from tfplace... import`),
so a forbidden dependency fails here even if no test happens to execute that line.
"""

import ast
import os
import subprocess
import sys

import pytest

# realpath: under Bazel the test file is a runfiles symlink into the checkout.
REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# folder -> (installed package, tfplace packages it may import besides itself)
PACKAGES = {
    "tfplace": ("tfplace", set()),
    "simulator": ("tfplace.simulator", {"tfplace"}),
    "policy": ("tfplace.policy", {"tfplace", "tfplace.simulator", "tfplace.baselines"}),
    "baselines": ("tfplace.baselines", {"tfplace", "tfplace.simulator"}),
    "graph_defs": ("tfplace.graph_defs", {"tfplace"}),
}
SUBPACKAGES = {pkg for pkg, _ in PACKAGES.values()} - {"tfplace"}


def _owner(module: str) -> str:
    """The layout package a dotted tfplace module name belongs to."""
    for sub in sorted(SUBPACKAGES, key=len, reverse=True):
        if module == sub or module.startswith(sub + "."):
            return sub
    return "tfplace"


def _tfplace_imports(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tfplace":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "tfplace":
                for alias in node.names:
                    yield node.lineno, f"{node.module}.{alias.name}" if node.module == "tfplace" else node.module


FOLDERS = {"simulator", "policy", "baselines", "graph_defs"}


def _bare_folder_imports(path):
    """Imports of a layout folder by its folder name (`import simulator`): they only work from
    the repository root and dodge the import rules; the installed name is `tfplace.<folder>`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for name in names:
            if name.split(".")[0] in FOLDERS:
                yield node.lineno, name


def test_no_bare_folder_imports():
    bad = []
    for folder in list(PACKAGES) + ["tests", "benchmarks", "examples"]:
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for fname in files:
                if fname.endswith(".py"):
                    path = os.path.join(root, fname)
                    bad += [f"{os.path.relpath(path, REPO)}:{n} imports {m}" for n, m in _bare_folder_imports(path)]
    assert not bad, "import these as tfplace.<folder>:\n" + "\n".join(bad)


def _is_entry_point(path):
    with open(path, encoding="utf-8") as f:
        return 'if __name__ == "__main__":' in f.read()


def test_top_level_layout():
    for name in ["tfplace", "graph_defs", "policy", "simulator", "baselines", "tests",
                 "activate.py", "BUILD", "WORKSPACE", "setup.py", "README.md", ".ci/run"]:
        assert os.path.exists(os.path.join(REPO, name)), f"missing {name}"


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_import_rules(folder):
    package, allowed = PACKAGES[folder]
    allowed = allowed | {package}
    bad = []
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for fname in files:
            if not fname.endswith(".py") or fname.startswith("test_") or fname.endswith("_test.py"):
                continue
            path = os.path.join(root, fname)
            if folder == "tfplace" and _is_entry_point(path):
                continue  # command-line entry points sit at the edge and wire the parts together
            for lineno, module in _tfplace_imports(path):
                owner = _owner(module)
                if owner not in allowed:
                    bad.append(f"{os.path.relpath(path, REPO)}:{lineno} imports {module}")
    assert not bad, f"{folder}/ may import only {sorted(allowed)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["tfplace", "tfplace.simulator", "tfplace.graph_ir",
                                    "tfplace.cluster", "tfplace.strategy", "tfplace.profile",
                                    "tfplace.lowering", "tfplace.grouping", "tfplace.testing"])
def test_pure_modules_do_not_load_tensorflow(module):
    code = f"import sys, {module}; sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"importing {module} loaded TensorFlow\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("package", sorted(pkg for pkg, _ in PACKAGES.values()))
def test_one_import_root(package):
    module = __import__(package, fromlist=["__name__"])
    folder = [f for f, (p, _) in PACKAGES.items() if p == package][0]
    assert os.path.realpath(os.path.dirname(module.__file__)) == os.path.realpath(os.path.join(REPO, folder))
