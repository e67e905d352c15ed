"""benchmarks/task_cpu_probe.py: what it prints per task is that task's own CPU. A chain of ops on
one task costs that task the most CPU; a further task's RunGraph costs that task CPU; a chain of
all-reduces costs each participant CPU and the task left out of it nothing. Multi-process."""

import numpy as np
import pytest

from tfplace.profiling import overheads_probe
from tfplace.runtime.local_cluster import LocalCluster

import task_cpu_probe as probe

pytestmark = pytest.mark.multiprocess
pytest.importorskip("tensorflow")


def test_each_task_is_charged_its_own_work():
    with LocalCluster(num_tasks=3, threads_per_task=[1, 1, 1], inter_threads_per_task=[1, 1, 1]) as lc:
        devs = lc.device_names
        further = probe.per_unit(lc, probe.further_tasks(devs), 1, steps=20)
        ops = {t: probe.per_unit(lc, probe.op_chain(devs, t), probe.CHAIN_OPS, steps=20) for t in (1, 2)}

        def pair_chain(present):
            return overheads_probe.collective_chain(devs, 4, 2, present, key_base=9000)
        reduce = probe.per_unit(lc, pair_chain, 4, steps=20)
    wall, cpu = further
    # every further task serves its RunGraph (hundreds of microseconds here) on its own CPU
    assert wall > 0 and cpu[1] > 1e-5 and cpu[2] > 1e-5
    for t, (_, cpu) in ops.items():
        assert int(np.argmax(cpu)) == t and cpu[t] > 0
    # an all-reduce between tasks 0 and 1 costs both of them; task 2 takes no part
    _, cpu = reduce
    assert cpu[0] > 1e-6 and cpu[1] > 1e-6 and abs(cpu[2]) < min(cpu[0], cpu[1])


def test_step_costs_gives_the_wall_and_each_task_cpu_or_none():
    with LocalCluster(num_tasks=2, threads_per_task=[1, 1], inter_threads_per_task=[1, 1]) as lc:
        wall, cpu = overheads_probe.step_costs(lc, lambda x0: [x0], wall_steps=3, cpu_steps=5)
        none_wall, none_cpu = overheads_probe.step_costs(lc, lambda x0: [x0], wall_steps=0, cpu_steps=0)
    assert wall > 0 and cpu.shape == (2,) and cpu[0] > 0
    assert none_wall is None and none_cpu is None


def test_without_collectives_makes_each_all_reduce_an_identity_and_keeps_the_rest():
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:worker/task:1/device:CPU:0"):
            x = tf.constant([1.0, 2.0], name="x")
            gate = tf.no_op(name="gate")
            with tf.control_dependencies([gate]):
                y = tf.raw_ops.CollectiveReduceV2(input=x, group_size=2, group_key=1, instance_key=7, ordering_token=[],
                                                  merge_op="Add", final_op="Id", name="reduce")
            tf.identity(y * 2.0, name="out")
    before = g.as_graph_def()
    plain, count = probe.without_collectives(before)
    assert count == {"/job:worker/task:1/device:CPU:0": 1}
    node = {n.name: n for n in plain.node}["reduce"]
    original = {n.name: n for n in before.node}["reduce"]
    assert node.op == "Identity" and node.input[0] == "x"
    # the all-reduce's other inputs order it still, and through them the control edge from gate
    assert list(node.input[1:]) == ["^" + i.split(":")[0] for i in original.input[1:]]
    preds = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in plain.node}
    seen, todo = set(), ["reduce"]
    while todo:
        for p in preds[todo.pop()]:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    assert "gate" in seen
    assert set(node.attr) == {"T"} and node.attr["T"].type == tf.float32.as_datatype_enum
    assert node.device == "/job:worker/task:1/device:CPU:0"
    # the input is left as it was; every other node unchanged
    assert {n.name: n.op for n in before.node}["reduce"] == "CollectiveReduceV2"
    assert [n for n in plain.node if n.name != "reduce"] == [n for n in before.node if n.name != "reduce"]
    local = type(plain)()
    local.CopyFrom(plain)
    for n in local.node:  # run it in this process: no worker task here
        n.device = ""
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(local, name="")
        with tf.compat.v1.Session() as sess:
            assert sess.run("out:0").tolist() == [2.0, 4.0]
