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

# tfplace's own sub-packages, in the order data flows through them: each may import only the
# ones named here (besides itself). `cli` is the edge: it may import everything, nothing imports
# it but the `python -m tfplace.X` shims at the top level.
CORE = {
    "formats": set(),
    "emulation": {"formats"},
    "ir": {"formats"},
    "runtime": {"formats", "ir", "emulation"},
    "profiling": {"formats", "ir", "runtime", "emulation"},
    "lowering": {"formats", "ir", "profiling"},
    "overheads": {"formats", "ir", "lowering", "profiling"},
    "rewrite": {"formats", "ir", "lowering", "runtime", "profiling"},
    "cli": None,  # everything
}
# which core sub-packages the other layout packages may import
OUTER_CORE = {
    "tfplace.simulator": {"formats", "lowering"},
    "tfplace.baselines": {"formats", "ir", "lowering", "profiling", "runtime", "emulation", "overheads"},
    "tfplace.policy": {"formats", "ir", "lowering", "profiling", "overheads", "rewrite"},
    "tfplace.graph_defs": {"formats", "ir"},
}
TOP_SHIMS = {"train", "pretrain", "plan", "simulate", "compare", "profile"}  # `python -m tfplace.X` -> tfplace.cli.X


def _owner(module: str) -> str:
    """The layout package a dotted tfplace module name belongs to."""
    for sub in sorted(SUBPACKAGES, key=len, reverse=True):
        if module == sub or module.startswith(sub + "."):
            return sub
    return "tfplace"


def _core_part(module: str):
    """The core sub-package (or top-level module) of a dotted tfplace module name, else None."""
    parts = module.split(".")
    if parts[0] != "tfplace" or len(parts) < 2 or _owner(module) != "tfplace":
        return None
    return parts[1]


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


def test_top_level_layout():
    for name in ["tfplace", "graph_defs", "policy", "simulator", "baselines", "tests",
                 "activate.py", "BUILD", "WORKSPACE", "setup.py", "README.md", ".ci/run"]:
        assert os.path.exists(os.path.join(REPO, name)), f"missing {name}"


def _production_files(folder):
    """Non-test .py files of a layout folder (test fakes included: they are importable code)."""
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        for fname in files:
            if fname.endswith(".py") and not (fname.startswith("test_") or fname.endswith("_test.py")):
                yield os.path.join(root, fname)


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_import_rules(folder):
    package, allowed = PACKAGES[folder]
    allowed = allowed | {package}
    bad = []
    for path in _production_files(folder):
        if folder == "tfplace" and os.sep + "cli" + os.sep in path:
            continue  # the command lines sit at the edge and wire the parts together
        for lineno, module in _tfplace_imports(path):
            owner = _owner(module)
            if owner not in allowed:
                bad.append(f"{os.path.relpath(path, REPO)}:{lineno} imports {module}")
    assert not bad, f"{folder}/ may import only {sorted(allowed)}:\n" + "\n".join(bad)


def _core_rule_violations(path, source_part, may_import):
    for lineno, module in _tfplace_imports(path):
        part = _core_part(module)
        if part is None or part == source_part:
            continue
        if part == "testing":
            yield f"{os.path.relpath(path, REPO)}:{lineno} imports {module} (test fakes are for tests only)"
        elif part in TOP_SHIMS or part == "cli":
            yield f"{os.path.relpath(path, REPO)}:{lineno} imports {module} (nothing imports the command lines)"
        elif may_import is not None and part not in may_import:
            yield f"{os.path.relpath(path, REPO)}:{lineno} imports {module} (allowed: {sorted(may_import)})"


def test_core_flows_one_way():
    """formats <- ir <- profiling <- lowering <- overheads / rewrite <- cli; no back-edges."""
    bad = []
    for part, may_import in CORE.items():
        assert os.path.isdir(os.path.join(REPO, "tfplace", part)), f"tfplace/{part}/ is missing"
        for path in _production_files(os.path.join("tfplace", part)):
            if part == "cli":
                continue
            bad += list(_core_rule_violations(path, part, may_import))
    for fname in os.listdir(os.path.join(REPO, "tfplace")):
        stem = fname[:-3]
        if fname.endswith(".py") and stem not in TOP_SHIMS and stem != "__init__":
            may = {"formats", "ir"} if stem == "testing" else set()
            bad += list(_core_rule_violations(os.path.join(REPO, "tfplace", fname), stem, may))
    for folder, (package, _) in PACKAGES.items():
        if folder == "tfplace":
            continue
        for path in _production_files(folder):
            is_fake = os.path.basename(path) in ("testing.py", "fakes.py", "testing_fixtures.py")
            # test fakes build whole test problems (graphs, groupings): only the CLI is off limits
            bad += [v for v in _core_rule_violations(path, None, None if is_fake else OUTER_CORE[package])
                    if not (is_fake and "test fakes" in v)]
    assert not bad, "back-edges in the core's data flow:\n" + "\n".join(bad)


def test_top_level_modules_are_few():
    """tfplace/ itself holds the package marker, the `python -m` shims and the test fakes only."""
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "tfplace")) if f.endswith(".py"))
    assert set(modules) <= TOP_SHIMS | {"__init__", "testing"}, modules
    for stem in TOP_SHIMS:
        with open(os.path.join(REPO, "tfplace", stem + ".py"), encoding="utf-8") as f:
            assert f"from tfplace.cli.{stem} import run" in f.read(), f"tfplace/{stem}.py is not a thin shim"


@pytest.mark.parametrize("module", ["tfplace", "tfplace.simulator", "tfplace.ir.graph_ir",
                                    "tfplace.formats.cluster", "tfplace.formats.strategy",
                                    "tfplace.formats.profile", "tfplace.lowering", "tfplace.lowering.lower",
                                    "tfplace.ir.grouping", "tfplace.testing"])
def test_pure_modules_do_not_load_tensorflow(module):
    code = f"import sys, {module}; sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"importing {module} loaded TensorFlow\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("package", sorted(pkg for pkg, _ in PACKAGES.values()))
def test_one_import_root(package):
    module = __import__(package, fromlist=["__name__"])
    folder = [f for f, (p, _) in PACKAGES.items() if p == package][0]
    assert os.path.realpath(os.path.dirname(module.__file__)) == os.path.realpath(os.path.join(REPO, folder))


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md's listing names every module of tfplace/ and no module that is gone."""
    with open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    listing = text[text.index("## Listing"):text.index("## Import rules")]
    rows = {}
    current = "tfplace"
    for line in listing.splitlines():
        words = line.split()
        if not words or words[0].startswith(("`", "Every", "#")):
            continue
        if words[0].endswith("/"):
            current = words[0].rstrip("/")
            words = words[1:]
        rows.setdefault(current, set()).update(w for w in words if w.endswith(".py"))
    actual = {"tfplace": {f for f in os.listdir(os.path.join(REPO, "tfplace")) if f.endswith(".py")}}
    for sub in sorted(CORE):
        folder = os.path.join(REPO, "tfplace", sub)
        actual[sub] = {f for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py"}
    assert rows == actual
