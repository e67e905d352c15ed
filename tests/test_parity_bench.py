"""benchmarks/parity_bench.py's arguments: bad ones are one line `error: ...` naming the argument
(or the cluster file's field) and the fix, exit status 2, before any export or server starts."""

import json
import os

import pytest

import parity_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "clusters", "local_cpu.json")


def _remote_cluster(tmp_path):
    with open(CLUSTER) as f:
        cluster = json.load(f)
    cluster["hosts"][0]["address"] = "10.1.2.3"
    path = tmp_path / "remote.json"
    path.write_text(json.dumps(cluster))
    return str(path)


@pytest.mark.parametrize("argv, expected", [
    (["--models", "tiny_mpl"], ["--models", "'tiny_mpl'"]),
    (["--steps", "0"], ["--steps", ">= 1"]),
    (["--rounds", "0"], ["--rounds", ">= 1"]),
    (["--batch-size", "0"], ["--batch-size", ">= 1"]),
    (["--warmup", "-1"], ["--warmup", ">= 0"]),
    (["--bucket-bytes", "0"], ["--bucket-bytes", "'0'"]),
    (["--ps-bucket-bytes", "64MiB"], ["--ps-bucket-bytes", "'64MiB'"]),
    (["--all-reduce", "ring"], ["--all-reduce", "'ring'"]),
    (["--cluster", "{remote}"], ["remote.json: hosts[0].address", "not this machine's loopback"]),
])
def test_bad_argument_exits_2_with_one_line_before_any_work(argv, expected, tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(parity_bench, "tfplace_steps", lambda *a, **k: started.append(a) or [1.0])
    monkeypatch.setattr(parity_bench, "horovod_steps", lambda *a, **k: started.append(a) or [1.0])
    monkeypatch.setattr("tfplace.graph_defs.export.ensure_bundle", lambda *a, **k: started.append(a) or "b.json")
    argv = [a.replace("{remote}", _remote_cluster(tmp_path)) for a in argv]
    status = parity_bench.main(["--models", "tiny_mlp", "--rounds", "1", "--steps", "1"] + argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(errors) == 1 and "Fix:" in errors[0], err
    assert "Traceback" not in err
    for text in expected:
        assert text in errors[0], (text, errors[0])
    assert not started


def test_good_arguments_run_every_round(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(parity_bench, "tfplace_steps", lambda *a, **k: ran.append("tfplace") or [1e-3])
    monkeypatch.setattr(parity_bench, "horovod_steps", lambda *a, **k: ran.append("horovod") or [2e-3])
    monkeypatch.setattr("tfplace.graph_defs.export.ensure_bundle", lambda *a, **k: "b.json")
    assert parity_bench.main(["--models", "tiny_mlp", "--rounds", "2", "--steps", "1", "--all-reduce",
                              "exchange"]) == 0
    assert ran == ["tfplace", "horovod"] * 2
    assert "0.50x Horovod" in capsys.readouterr().out
