"""Per-op GPU kernel times by replaying every op of a step with PyTorch kernels of the same shapes.

For GPU machines that have PyTorch but no TensorFlow (TensorFlow wheels cannot be installed
there). Each TensorFlow op with device work is re-created as the equivalent PyTorch/cuDNN/cuBLAS
call on tensors of the op's shapes (NHWC as channels_last; TF32 on for conv and matmul, as
TensorFlow enables it by default) and timed with CUDA events. It measures the kernels, not
TensorFlow's executor, so it is a reference for the device model's per-op accuracy, not a
replacement for `tfplace.profiling.profiler` on a TensorFlow GPU machine.

    # here (TensorFlow side): the op table of a graph
    python -m tfplace.cli.kernel_replay export --graph graph_defs/zoo/resnet50_b64_s224_sgd.json --out ops.json
    # on the GPU machine (the checkout with torch and absl-py; no TensorFlow needed):
    python -m tfplace.cli.kernel_replay replay --ops ops.json --batch-sizes 8,16,32 --out replay.json
    # here: a profile keyed by the GPU kind
    python -m tfplace.cli.kernel_replay to-profile --replay replay.json --kind H100 --out profile.json

(the command line lives in tfplace/cli/kernel_replay.py; this module is the library)

Op table: {"format": OPS_FORMAT, "version": 1, "graph", "reference_batch_size", "ops": [{"name",
"type", "in": [[shape, dtype, batch_axis, const values or null]], "out": [[shape, dtype,
batch_axis]], "attrs": {...}}]}.
Replay result: {"format": RESULT_FORMAT, "version": 1, "graph", "device", "torch", "batch_sizes",
"seconds": {name: {batch: seconds}}, "skipped": {name: reason}}. Ops without device work (host ops)
are not replayed; they are listed as skipped, and to-profile lists them in missing_ops.
`read_op_table` and `read_replay_result` check a file is the one they read (files written before
they carried "format" and "version" are read too).
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Sequence

OPS_FORMAT = "tfplace.profiling.kernel_replay_ops"
RESULT_FORMAT = "tfplace.profiling.kernel_replay"
VERSION = 1

_ATTR_KEYS = ("strides", "padding", "explicit_paddings", "dilations", "data_format", "ksize", "transpose_a",
              "transpose_b", "adj_x", "adj_y", "is_training", "epsilon", "keep_dims", "axis", "equation", "T",
              "DstT", "depth_multiplier")


# ---------------------------------------------------------------------------------------------
# export (TensorFlow side; reads the OpGraph and its GraphDef)
# ---------------------------------------------------------------------------------------------

def _attr_value(v):
    kind = v.WhichOneof("value")
    if kind == "list":
        if v.list.i:
            return list(v.list.i)
        if v.list.s:
            return [s.decode() for s in v.list.s]
        return []
    if kind == "s":
        return v.s.decode()
    if kind in ("i", "b", "f"):
        return getattr(v, kind)
    return None


def export_op_table(graph) -> Dict[str, Any]:
    """The op table (module docstring) of an OpGraph whose graph_def is present."""
    from tensorflow.python.framework import tensor_util

    nodes = {n.name: n for n in graph.graph_def.node}
    consts = {}
    for n in graph.graph_def.node:
        if n.op == "Const":
            arr = tensor_util.MakeNdarray(n.attr["value"].tensor)
            if arr.size <= 64:
                consts[n.name] = arr.tolist()
    ins: List[List[tuple]] = [[] for _ in graph.names]
    for t, d, p in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist(), graph.edge_dst_port.tolist()):
        ins[d].append((p, t))
    outs: List[List[tuple]] = [[] for _ in graph.names]
    for t, (o, p) in enumerate(zip(graph.tensor_op.tolist(), graph.tensor_port.tolist())):
        outs[o].append((p, t))

    def tensor(t, with_const):
        row = [list(graph.tensor_shape[t]), graph.tensor_dtype[t], int(graph.tensor_batch_axis[t])]
        if with_const:
            src = graph.names[graph.tensor_op[t]]
            row.append(consts.get(src) if graph.op_types[graph.tensor_op[t]] == "Const" else None)
        return row

    ops = []
    for i, (name, op_type) in enumerate(zip(graph.names, graph.op_types)):
        node = nodes.get(name)
        attrs = {k: _attr_value(node.attr[k]) for k in _ATTR_KEYS if node is not None and k in node.attr}
        ops.append({"name": name, "type": op_type, "in": [tensor(t, True) for _, t in sorted(ins[i])],
                    "out": [tensor(t, False) for _, t in sorted(outs[i])], "attrs": attrs})
    from tfplace.formats.profile import graph_name  # here: the replay side imports no tfplace module
    return {"format": OPS_FORMAT, "version": VERSION, "graph": graph_name(graph.source),
            "reference_batch_size": graph.reference_batch_size, "ops": ops}


# ---------------------------------------------------------------------------------------------
# replay (PyTorch side; no tfplace or TensorFlow imports)
# ---------------------------------------------------------------------------------------------

_UNARY = {"Relu": "relu", "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Log1p": "log1p",
          "Tanh": "tanh", "Sigmoid": "sigmoid", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Square": "square",
          "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Sin": "sin", "Cos": "cos", "Reciprocal": "reciprocal",
          "Sign": "sign", "Softplus": "softplus", "LogicalNot": "logical_not", "IsFinite": "isfinite"}
_BINARY = {"AddV2": "add", "Add": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div", "Div": "div",
           "Maximum": "maximum", "Minimum": "minimum", "Pow": "pow", "FloorDiv": "floor_divide",
           "FloorMod": "remainder", "Greater": "gt", "GreaterEqual": "ge", "Less": "lt", "LessEqual": "le",
           "Equal": "eq", "NotEqual": "ne", "LogicalAnd": "logical_and", "LogicalOr": "logical_or",
           "BiasAdd": "add", "RsqrtGrad": "mul", "SqrtGrad": "div", "ReciprocalGrad": "mul",
           "DivNoNan": "div", "MulNoNan": "mul"}
_HOST = {"NoOp", "Const", "VarHandleOp", "Placeholder", "Identity", "IdentityN", "StopGradient", "ReadVariableOp",
         "Shape", "ShapeN", "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "BroadcastGradientArgs",
         "ConcatOffset", "InvertPermutation", "Range", "DynamicStitch", "PreventGradient", "Snapshot"}


def _dims(shape, axis, batch, ref):
    out = [max(int(d), 1) for d in shape]
    if 0 <= axis < len(out):
        out[axis] = max(1, int(round(out[axis] * batch / ref)))
    return out


def _replay_fn(torch, op, batch, ref, dev):
    """A zero-argument callable that runs the op's kernel(s), or a str saying why not."""
    import torch.nn.functional as F

    t = op["type"]
    if t in _HOST:
        return "host op: no device kernel"
    ins = [(_dims(s, a, batch, ref), dt, c) for s, dt, a, c in op["in"]]
    outs = [(_dims(s, a, batch, ref), dt) for s, dt, a in op["out"]]
    at = op["attrs"]
    fdt = torch.float32
    cl = torch.channels_last

    def rand(shape, dtype="float32"):
        if dtype in ("int32", "int64"):
            return torch.randint(0, 2, shape, device=dev, dtype=getattr(torch, dtype))
        if dtype == "bool":
            return torch.rand(shape, device=dev) < 0.5
        if dtype in ("resource", "variant", "string"):
            return None
        x = torch.rand(shape, device=dev, dtype=fdt)
        return x.to(memory_format=cl) if len(shape) == 4 else x

    def nchw(s):  # NHWC shape -> NCHW sizes for torch
        return [s[0], s[3], s[1], s[2]] if at.get("data_format", "NHWC") == "NHWC" else list(s)

    def conv_geometry(x_shape, w_shape, y_shape):
        st = at.get("strides", [1, 1, 1, 1])
        dl = at.get("dilations", [1, 1, 1, 1])
        sh, sw = (st[1], st[2]) if at.get("data_format", "NHWC") == "NHWC" else (st[2], st[3])
        dh, dw = (dl[1], dl[2]) if at.get("data_format", "NHWC") == "NHWC" else (dl[2], dl[3])
        xs, ys = nchw(x_shape), nchw(y_shape)
        pads = []
        for i, (k, s, d) in enumerate(((w_shape[0], sh, dh), (w_shape[1], sw, dw))):
            total = max((ys[2 + i] - 1) * s + (k - 1) * d + 1 - xs[2 + i], 0)
            pads.append(total // 2)
        return (sh, sw), pads, (dh, dw)

    if t in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "DepthwiseConv2dNative",
             "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"):
        depthwise = t.startswith("Depthwise")
        if t in ("Conv2D", "DepthwiseConv2dNative"):
            x_shape, w_shape, y_shape = ins[0][0], ins[1][0], outs[0][0]
        elif t.endswith("BackpropInput"):
            x_shape, w_shape, y_shape = outs[0][0], ins[1][0], ins[2][0]
        else:
            x_shape, w_shape, y_shape = ins[0][0], outs[0][0], ins[2][0]
        stride, pad, dil = conv_geometry(x_shape, w_shape, y_shape)
        kh, kw, cin, cm = w_shape
        groups = cin if depthwise else 1
        cout = cin * cm if depthwise else cm
        x = torch.rand(nchw(x_shape), device=dev).to(memory_format=cl)
        w = torch.rand([cout, cin // groups, kh, kw], device=dev).to(memory_format=cl)
        if t in ("Conv2D", "DepthwiseConv2dNative"):
            return lambda: F.conv2d(x, w, None, stride, pad, dil, groups)
        y = F.conv2d(x, w, None, stride, pad, dil, groups)
        gy = torch.rand_like(y)
        mask = [True, False, False] if t.endswith("BackpropInput") else [False, True, False]
        return lambda: torch.ops.aten.convolution_backward(gy, x, w, None, stride, pad, dil, False, [0, 0],
                                                           groups, mask)
    if t in ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "BatchMatMul"):
        a, b = rand(ins[0][0]), rand(ins[1][0])
        ta = at.get("transpose_a", at.get("adj_x", False))
        tb = at.get("transpose_b", at.get("adj_y", False))
        return lambda: torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)
    if t in ("FusedBatchNormV3", "FusedBatchNorm", "FusedBatchNormV2"):
        x = rand(ins[0][0])
        c = x.shape[1 if at.get("data_format", "NHWC") != "NHWC" else -1]
        x = torch.rand(nchw(ins[0][0]), device=dev).to(memory_format=cl) if x.dim() == 4 else x
        c = x.shape[1]
        g, b, m, v = (torch.rand(c, device=dev) for _ in range(4))
        train = at.get("is_training", True)
        return lambda: F.batch_norm(x, m, v, g, b, training=train, eps=at.get("epsilon", 1e-3))
    if t in ("FusedBatchNormGradV3", "FusedBatchNormGrad", "FusedBatchNormGradV2"):
        x = torch.rand(nchw(ins[1][0]), device=dev).to(memory_format=cl)
        gy = torch.rand_like(x)
        c = x.shape[1]
        g, m, v = (torch.rand(c, device=dev) for _ in range(3))
        sm, si = torch.rand(c, device=dev), torch.rand(c, device=dev)
        return lambda: torch.ops.aten.native_batch_norm_backward(gy, x, g, m, v, sm, si, True, 1e-3,
                                                                 [True, True, True])
    if t in ("MaxPool", "AvgPool", "MaxPoolGrad", "AvgPoolGrad"):
        ks, st = at.get("ksize", [1, 2, 2, 1]), at.get("strides", [1, 2, 2, 1])
        k, s = (ks[1], ks[2]), (st[1], st[2])
        x_shape = ins[0][0] if t in ("MaxPool", "AvgPool", "MaxPoolGrad") else outs[0][0]
        x = torch.rand(nchw(x_shape), device=dev).to(memory_format=cl)
        y_shape = outs[0][0] if t in ("MaxPool", "AvgPool") else ins[-1][0]
        pad = [max(((nchw(y_shape)[2 + i] - 1) * s[i] + k[i] - x.shape[2 + i]) // 2, 0) for i in range(2)]
        pad = [min(p, k[i] // 2) for i, p in enumerate(pad)]
        if t == "MaxPool":
            return lambda: F.max_pool2d(x, k, s, pad)
        if t == "AvgPool":
            return lambda: F.avg_pool2d(x, k, s, pad)
        if t == "MaxPoolGrad":
            y, idx = F.max_pool2d(x, k, s, pad, return_indices=True)
            gy = torch.rand_like(y)
            return lambda: torch.ops.aten.max_pool2d_with_indices_backward(gy, x, k, s, pad, [1, 1], False, idx)
        y = F.avg_pool2d(x, k, s, pad)
        gy = torch.rand_like(y)
        return lambda: torch.ops.aten.avg_pool2d_backward(gy, x, k, s, pad, False, True, None)
    if t in ("Softmax", "LogSoftmax"):
        x = rand(ins[0][0])
        return (lambda: torch.softmax(x, -1)) if t == "Softmax" else (lambda: torch.log_softmax(x, -1))
    if t in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
        x = rand(ins[0][0])
        lab = torch.randint(0, x.shape[-1], x.shape[:-1], device=dev)
        return lambda: (F.cross_entropy(x, lab, reduction="none"), torch.softmax(x, -1))
    if t in ("ReluGrad", "Relu6Grad", "TanhGrad", "SigmoidGrad"):
        g, y = rand(ins[0][0]), rand(ins[1][0])
        return {"ReluGrad": lambda: torch.ops.aten.threshold_backward(g, y, 0.0),
                "Relu6Grad": lambda: torch.ops.aten.hardtanh_backward(g, y, 0.0, 6.0),
                "TanhGrad": lambda: torch.ops.aten.tanh_backward(y, g),
                "SigmoidGrad": lambda: torch.ops.aten.sigmoid_backward(y, g)}[t]
    if t == "Relu6":
        x = rand(ins[0][0])
        return lambda: F.relu6(x)
    if t in _UNARY:
        x = rand(ins[0][0], ins[0][1])
        fn = getattr(torch, _UNARY[t])
        return lambda: fn(x)
    if t == "Cast":
        x = rand(ins[0][0], ins[0][1])
        dst = getattr(torch, outs[0][1], torch.float32)
        return lambda: x.to(dst)
    if t == "SquaredDifference":
        a, b = rand(ins[0][0]), rand(ins[1][0])
        return lambda: torch.ops.aten.mse_loss(a, b.expand_as(a) if b.dim() <= a.dim() else b, 0)
    if t in _BINARY:
        a, b = rand(ins[0][0], ins[0][1]), rand(ins[1][0], ins[1][1])
        fn = getattr(torch, _BINARY[t])
        return lambda: fn(a, b)
    if t in ("Select", "SelectV2"):
        c, a, b = rand(ins[0][0], "bool"), rand(ins[1][0]), rand(ins[2][0])
        return lambda: torch.where(c, a, b)
    if t == "AddN":
        xs = [rand(s) for s, _, _ in ins]
        return lambda: torch.stack(xs).sum(0) if len(xs) > 2 else torch.add(xs[0], xs[1])
    if t in ("Sum", "Mean", "Max", "Min", "Prod", "BiasAddGrad", "ArgMax", "L2Loss"):
        x = rand(ins[0][0], ins[0][1])
        if t == "BiasAddGrad":
            dims = list(range(x.dim() - 1))
        elif t == "L2Loss":
            dims = list(range(x.dim()))
        else:
            axes = ins[1][2] if len(ins) > 1 else None
            axes = [axes] if isinstance(axes, int) else axes
            dims = [a % max(x.dim(), 1) for a in axes] if axes else list(range(x.dim()))
        fn = {"Sum": torch.sum, "Mean": torch.mean, "Max": torch.amax, "Min": torch.amin, "Prod": torch.sum,
              "BiasAddGrad": torch.sum, "L2Loss": torch.sum, "ArgMax": torch.amax}[t]
        if x.dim() == 0 or not dims:
            return lambda: x.clone()
        return lambda: fn(x, dim=dims)
    if t in ("ResourceApplyGradientDescent", "ApplyGradientDescent"):
        g = rand(ins[2][0])
        v = torch.rand_like(g)
        return lambda: v.add_(g, alpha=-0.01)
    if t in ("ResourceApplyMomentum", "ResourceApplyKerasMomentum"):
        g = rand(ins[3][0])
        v, acc = torch.rand_like(g), torch.rand_like(g)
        return lambda: (acc.mul_(0.9).add_(g), v.add_(acc, alpha=-0.01))
    if t in ("AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp"):
        x = rand(ins[1][0])
        v = torch.rand_like(x)
        return {"AssignSubVariableOp": lambda: v.sub_(x), "AssignAddVariableOp": lambda: v.add_(x),
                "AssignVariableOp": lambda: v.copy_(x)}[t]
    if t == "Transpose":
        x = rand(ins[0][0])
        perm = ins[1][2] or _perm_from_shapes(ins[0][0], outs[0][0])
        if not perm:
            return "Transpose without a constant permutation"
        return lambda: x.permute(*perm).contiguous()
    if t in ("ConcatV2",):
        xs = [rand(s) for s, dt, _ in ins[:-1]]
        axis = ins[-1][2]
        if not isinstance(axis, int):
            return "ConcatV2 without a constant axis"
        return lambda: torch.cat(xs, axis)
    if t in ("Slice", "StridedSlice", "GatherV2", "ResourceGather", "GatherNd"):
        n = 1
        for d in outs[0][0]:
            n *= d
        src = torch.rand(max(n, 1) * 2, device=dev)
        return lambda: src[:n].clone()
    if t in ("Pad", "PadV2", "MirrorPad", "Tile", "BroadcastTo"):
        x = rand(ins[0][0])
        out = torch.empty(outs[0][0], device=dev)
        return lambda: out.copy_(x.reshape(-1)[:1].expand_as(out)) if x.numel() else out.zero_()
    if t == "Pack":
        xs = [rand(s) for s, dt, _ in ins]
        return lambda: torch.stack(xs, at.get("axis", 0) or 0)
    if t in ("StridedSliceGrad", "SliceGrad"):
        out = torch.empty(outs[0][0], device=dev)
        g = rand(ins[-1][0])
        n = g.numel()
        return lambda: (out.zero_(), out.view(-1)[:n].copy_(g.reshape(-1)))
    if t in ("Fill", "ZerosLike", "OnesLike"):
        out = torch.empty(outs[0][0], device=dev)
        return lambda: out.fill_(1.0)
    if t in ("UnsortedSegmentSum",):
        data = rand(ins[0][0])
        n = outs[0][0][0]
        idx = torch.randint(0, n, (data.shape[0],), device=dev)
        out = torch.zeros(outs[0][0], device=dev)
        return lambda: out.index_add_(0, idx, data)
    if t == "OneHot":
        idx = torch.randint(0, outs[0][0][-1], ins[0][0], device=dev)
        return lambda: F.one_hot(idx, outs[0][0][-1])
    if t.startswith("StatelessRandom") or t.startswith("Random") or t == "TruncatedNormal":
        if not outs or not outs[0][0]:
            return "random op without a tensor output"
        return lambda: torch.rand(outs[0][0], device=dev)
    return f"no PyTorch equivalent for {t}"


_INNER = 10


def _warm_clocks(torch, dev, seconds: float = 2.0) -> None:
    """Busy the GPU for a moment so the first ops are not timed at idle clocks."""
    a = torch.rand(4096, 4096, device=dev)
    end = time.time() + seconds
    while time.time() < end:
        (a @ a).sum().item()


def _time_op(torch, fn, reps: int, warmup: int):
    """Seconds per launch of fn. Captured in a CUDA graph of _INNER launches where possible, so
    the time is the kernels' and not Python's dispatch (which is slower than a small kernel);
    otherwise _INNER back-to-back launches between two CUDA events."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run, how = None, "cuda_graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(_INNER):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        run = graph.replay
    except Exception:  # ops that synchronise with the host cannot be captured
        torch.cuda.synchronize()
        how = "events"

        def run():
            for _ in range(_INNER):
                fn()
        run()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3 / _INNER)
    times.sort()
    return times[len(times) // 2], how


def _perm_from_shapes(a, b):
    """A permutation p with b[i] == a[p[i]] (the first found), or None."""
    used, perm = set(), []
    for d in b:
        k = next((i for i, x in enumerate(a) if x == d and i not in used), None)
        if k is None:
            return None
        used.add(k)
        perm.append(k)
    return perm


def replay(table: Dict[str, Any], batch_sizes: Sequence[int], reps: int = 7, warmup: int = 3,
           progress=None) -> Dict[str, Any]:
    """Times every op of the table at each batch size on cuda:0 (median of `reps` launches).
    Raises InputError when PyTorch or a CUDA device is missing (the replay runs on the GPU)."""
    from tfplace.formats.errors import InputError
    try:
        import torch
    except ImportError:
        raise InputError("kernel_replay replay", "", "needs PyTorch, which is not installed",
                         "run the replay on a GPU machine with PyTorch (pip install torch); export the op table "
                         "here and copy it there") from None
    if not torch.cuda.is_available():
        raise InputError("kernel_replay replay", "", "needs a CUDA device, and PyTorch sees none",
                         "run the replay on a GPU machine; export the op table here and copy it there")

    torch.backends.cuda.matmul.allow_tf32 = True   # TensorFlow's default on Ampere and later
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True          # like TF's autotuning of conv algorithms
    dev = torch.device("cuda:0")
    ref = table["reference_batch_size"]
    seconds: Dict[str, Dict[str, float]] = {}
    skipped: Dict[str, str] = {}
    cache: Dict[str, float] = {}
    methods: Dict[str, int] = {}
    _warm_clocks(torch, dev)
    start = time.time()
    for bi, b in enumerate(batch_sizes):
        for op in table["ops"]:
            key = json.dumps([op["type"], op["in"], op["out"], op["attrs"], b], sort_keys=True)
            if key in cache:
                seconds.setdefault(op["name"], {})[str(b)] = cache[key]
                continue
            try:
                fn = _replay_fn(torch, op, b, ref, dev)
            except Exception as e:  # a shape the equivalent cannot take: report, go on
                fn = f"replay failed: {type(e).__name__}: {str(e)[:160]}"
            if isinstance(fn, str):
                skipped[op["name"]] = fn
                continue
            try:
                secs, how = _time_op(torch, fn, reps, warmup)
            except Exception as e:
                skipped[op["name"]] = f"replay failed: {type(e).__name__}: {str(e)[:160]}"
                continue
            methods[how] = methods.get(how, 0) + 1
            cache[key] = secs
            seconds.setdefault(op["name"], {})[str(b)] = secs
        if progress:
            progress(f"batch {b} done ({bi + 1}/{len(batch_sizes)}), {time.time() - start:.0f} s")
    return {"format": RESULT_FORMAT, "version": VERSION, "graph": table["graph"],
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "batch_sizes": list(batch_sizes), "reps": reps,
            "statistic": "median over replays of a CUDA graph of 10 launches, per launch",
            "tf32": True, "timing": methods, "seconds": seconds,
            "skipped": {k: v for k, v in skipped.items() if k not in seconds},
            "elapsed_s": round(time.time() - start, 1)}


# ---------------------------------------------------------------------------------------------
# reading the files back (both sides: tfplace.formats only, no TensorFlow)
# ---------------------------------------------------------------------------------------------

_OPS_FIX = "give the op table that `python -m tfplace.cli.kernel_replay export` wrote (its --out)"
_RESULT_FIX = "give the replay result that `python -m tfplace.cli.kernel_replay replay` wrote (its --out)"


def _reader(path: str, fmt: str, what: str, fix: str):
    """A FieldReader on the JSON object in `path`, whose "format" (when given) is `fmt` and
    "version" (when given) VERSION; else InputError saying the file is not `what`."""
    from tfplace.formats.jsonio import FieldReader
    r = FieldReader.from_file(path)
    found = r.get("format", str, default=fmt)
    if found != fmt:
        raise r.error("format", f"is {found!r}: the file is not {what}", fix)
    r.get("version", int, default=VERSION, check=lambda v: v == VERSION, must=f"be {VERSION}",
          fix=f"{fix}, by this version of tfplace")
    return r


def read_op_table(path: str) -> Dict[str, Any]:
    """The op table (module docstring) in the JSON file `path`. Raises InputError naming the file,
    the field and the fix for any other file (a replay result, a bundle, a strategy)."""
    r = _reader(path, OPS_FORMAT, "an op table", _OPS_FIX)
    r.get("ops", list, fix=_OPS_FIX)
    r.get("graph", str, fix=_OPS_FIX)
    r.get("reference_batch_size", int, check=lambda v: v >= 1, must="be >= 1", fix=_OPS_FIX)
    for op in r.items("ops"):
        op.get("name", str, fix=_OPS_FIX)
        op.get("type", str, fix=_OPS_FIX)
        op.get("in", list, fix=_OPS_FIX)
        op.get("out", list, fix=_OPS_FIX)
        op.get("attrs", dict, fix=_OPS_FIX)
    return r.data


def read_replay_result(path: str) -> Dict[str, Any]:
    """The replay result (module docstring) in the JSON file `path`: per-op seconds (>= 0) keyed by
    batch sizes (integers >= 1). Raises InputError naming the file, the field and the fix for any
    other file (an op table, a profile, a strategy)."""
    r = _reader(path, RESULT_FORMAT, "a replay result", _RESULT_FIX)
    r.get("seconds", dict, fix=_RESULT_FIX)
    r.get("graph", str, fix=_RESULT_FIX)
    for _, per in r.child("seconds").entries():
        for batch in per.data:
            if not (batch.isdigit() and int(batch) >= 1):
                raise per.error(batch, "is not a batch size",
                                f"key each op's seconds by batch sizes >= 1; {_RESULT_FIX}")
            per.get(batch, float, check=lambda v: v >= 0, must="be >= 0", fix=_RESULT_FIX)
    skipped = r.child("skipped", default_empty=True)
    for name in skipped.data:
        skipped.get(name, str, fix=_RESULT_FIX)
    return r.data


# ---------------------------------------------------------------------------------------------
# back to a Profile (tfplace side)
# ---------------------------------------------------------------------------------------------

def replay_to_profile(result: Dict[str, Any], kind: str):
    """A Profile keyed by `kind` from a replay result; skipped ops are its missing_ops."""
    from tfplace.formats.profile import Profile

    ops = {}
    for name, per in result["seconds"].items():
        pts = sorted((int(b), float(s)) for b, s in per.items())
        ops[name] = {kind: (tuple(b for b, _ in pts), tuple(s for _, s in pts))}
    conditions = {k: result[k] for k in ("device", "torch", "cuda", "cudnn", "reps", "statistic", "tf32", "elapsed_s")
                  if k in result}
    conditions["method"] = ("each TF op re-created with the equivalent PyTorch kernel (cuDNN/cuBLAS, NHWC as "
                            "channels_last, TF32 on) and timed with CUDA events; kernels only, no TF executor")
    by_reason: Dict[str, int] = {}
    for reason in result.get("skipped", {}).values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    conditions["missing_ops_by_reason"] = by_reason
    return Profile(ops=ops, graph=result["graph"], conditions=conditions, missing_ops=tuple(result.get("skipped", {})))
