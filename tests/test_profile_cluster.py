"""`python -m tfplace.profile --cluster C` (tfplace.cli.profile.profile_cluster): one child per
device kind, and --out is written only once every kind is in. The children are stand-ins here
(subprocess.run replaced): each writes or merges the kind it was asked for."""

import io
import json
import os
import subprocess

import pytest

from tfplace.cli import profile
from tfplace.formats.cluster import load_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HETERO = os.path.join(ROOT, "clusters", "local_cpu_hetero.json")
TINY = os.path.join(ROOT, "graph_defs", "zoo", "tiny_mlp_b16_sgd.json")


def _fake_children(stop_at_kind=None, fail_at_kind=None):
    """subprocess.run for profile's children: adds its --kind to the JSON list in its --out
    (`--merge`: to what is there); at `stop_at_kind` Ctrl-C arrives, at `fail_at_kind` it exits 1."""
    calls, real_run = [], subprocess.run

    def run(cmd, **kw):
        if "tfplace.profile" not in cmd:  # another command of the library (e.g. a probe of the machine)
            return real_run(cmd, **kw)
        kind, out = cmd[cmd.index("--kind") + 1], cmd[cmd.index("--out") + 1]
        calls.append(kind)
        if kind == stop_at_kind:
            raise KeyboardInterrupt()
        if kind == fail_at_kind:
            return subprocess.CompletedProcess(cmd, 1, stdout="error: broken\n")
        kinds = json.load(open(out)) if "--merge" in cmd else []
        with open(out, "w") as f:
            json.dump(kinds + [kind], f)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"wrote {out}\n")
    return run, calls


def test_every_kind_lands_in_out_and_the_summary_names_it(tmp_path, monkeypatch, capsys):
    run, calls = _fake_children()
    monkeypatch.setattr(subprocess, "run", run)
    out = str(tmp_path / "p.json")
    shown = io.StringIO()
    profile.profile_cluster(TINY, load_cluster(HETERO), out, [8], stdout=shown)
    assert calls == ["CPU", "CPU_half"]
    assert json.load(open(out)) == ["CPU", "CPU_half"]
    assert os.listdir(tmp_path) == ["p.json"]
    assert shown.getvalue() == f"wrote {out}\n" * 2


@pytest.mark.parametrize("stop, fail", [("CPU_half", None), (None, "CPU_half")], ids=["ctrl-c", "child-failed"])
def test_a_stopped_or_failed_run_keeps_the_earlier_out(tmp_path, monkeypatch, stop, fail):
    run, calls = _fake_children(stop_at_kind=stop, fail_at_kind=fail)
    monkeypatch.setattr(subprocess, "run", run)
    out = tmp_path / "p.json"
    out.write_text('"an earlier profile"')
    with pytest.raises(KeyboardInterrupt if stop else RuntimeError):
        profile.profile_cluster(TINY, load_cluster(HETERO), str(out), [8])
    assert calls == ["CPU", "CPU_half"]  # the first kind was measured, then the run stopped
    assert out.read_text() == '"an earlier profile"'  # not replaced by a profile of one kind
    assert os.listdir(tmp_path) == ["p.json"]  # and no partial file left
