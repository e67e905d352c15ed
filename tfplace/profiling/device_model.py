"""Roofline device model: FLOPs and memory bytes per op from shapes, a table of real devices,
and profiles for device kinds nobody measured.

    spec = device_spec("V100")
    costs = op_costs(graph, batch_size=32)               # OpCosts: flops[N], bytes[N], klass[N]
    seconds = roofline_seconds(spec, costs)              # float64 [N]
    derived = derive_profile(measured, graph, "CPU", ["V100", "P100"], [8, 16, 32])
    estimate = roofline_profile(graph, ["V100", "T4"])   # nothing measured at all
    relative_speed("P100")                               # ~0.6 (V100 = 1)

Roofline time of one op on one device kind:

    t = max(flops / (peak * compute_efficiency), bytes / (bandwidth * memory_efficiency)) + launch
    t = host_op_overhead                                          for ops with no kernel work

`peak` is the FP32 rate, except for convolutions and matrix products on kinds whose tensor cores
TensorFlow uses for FP32 by default (TF32 on Ampere and Hopper: A100, H100, H200). `launch` is
the per-kernel launch and framework cost (~5 µs on GPUs). Ops that move no data on the device
(NoOp, Const, shape arithmetic, reshapes, variable handles and reads) cost `host_op_overhead_s`.

A derived profile swaps the measured op's fixed per-op cost for the target's and scales the
rest by the ratio of the two kinds' roofline work times for that op at that batch size, so the
op-specific inefficiency the measurement saw (a kernel that reaches 30% of peak) carries over,
while the device's speed, balance and launch cost come from the table (`derive_profile`).

Shapes come from the OpGraph at its reference batch size; at another per-device batch size
every tensor's batch axis is scaled (tfplace.ir.graph_ir). This module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import os
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfplace.formats.errors import InputError
from tfplace.ir.graph_ir import DTYPE_BYTES, OpGraph
from tfplace.formats.profile import Profile, graph_name

# ---------------------------------------------------------------------------------------------
# Device table
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """What the roofline needs to know about one device kind.

    Attributes:
      kind: the key used in clusters and profiles ("V100").
      peak_flops_per_s: peak FP32 rate on the CUDA/vector cores.
      memory_bandwidth_bytes_per_s: peak device-memory bandwidth.
      memory_bytes: device memory capacity.
      matmul_flops_per_s: rate TensorFlow gets for FP32 conv/matmul by default when it differs
        from the FP32 peak (TF32 tensor cores on Ampere/Hopper; TF >= 2.4 enables TF32 by default).
      compute_efficiency: fraction of the peak dense kernels reach (cuDNN/cuBLAS FP32 ~0.6-0.7).
      memory_efficiency: fraction of the bandwidth streaming kernels reach (~0.75-0.85).
      launch_overhead_s: fixed cost per op that runs a kernel.
      host_op_overhead_s: cost of an op that does no kernel work (runs on the host).
      source: where the numbers come from.
    """
    kind: str
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int
    matmul_flops_per_s: Optional[float] = None
    compute_efficiency: float = 0.65
    memory_efficiency: float = 0.8
    launch_overhead_s: float = 5e-6
    host_op_overhead_s: float = 1e-6
    source: str = ""

    def rate(self, matmul: bool) -> float:
        peak = self.matmul_flops_per_s if (matmul and self.matmul_flops_per_s) else self.peak_flops_per_s
        return peak * self.compute_efficiency

    def summary(self) -> Dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


GiB = 1 << 30

# Datasheet figures (FP32 without sparsity; memory as the card's capacity):
DEVICES: Mapping[str, DeviceSpec] = {d.kind: d for d in (
    # NVIDIA Tesla V100 datasheet (SXM2 16 GB): 15.7 TFLOPS FP32, 900 GB/s HBM2.
    DeviceSpec("V100", 15.7e12, 900e9, 16 * GiB, source="NVIDIA Tesla V100 datasheet, SXM2 16 GB"),
    # NVIDIA Tesla P100 datasheet (PCIe 12 GB): 9.3 TFLOPS FP32, 549 GB/s HBM2.
    DeviceSpec("P100", 9.3e12, 549e9, 12 * GiB, source="NVIDIA Tesla P100 datasheet, PCIe 12 GB"),
    # NVIDIA GeForce GTX 1080 Ti spec sheet: 3584 cores x 1582 MHz boost x 2 = 11.3 TFLOPS,
    # 11 Gbps GDDR5X on 352 bits = 484 GB/s, 11 GB.
    DeviceSpec("GTX1080Ti", 11.3e12, 484e9, 11 * GiB, source="NVIDIA GeForce GTX 1080 Ti specifications"),
    # NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 320 GB/s GDDR6, 16 GB; 70 W, so it clocks down
    # under sustained load: lower efficiency.
    DeviceSpec("T4", 8.1e12, 320e9, 16 * GiB, compute_efficiency=0.5,
               source="NVIDIA T4 datasheet"),
    # NVIDIA A100 datasheet (40 GB SXM): 19.5 TFLOPS FP32, 156 TFLOPS TF32 (dense), 1555 GB/s.
    # TF32 reaches a smaller fraction of its peak than FP32 does (memory and epilogue bound).
    DeviceSpec("A100", 19.5e12, 1555e9, 40 * GiB, matmul_flops_per_s=156e12 * 0.5,
               source="NVIDIA A100 datasheet, 40 GB; TF32 dense 156 TFLOPS counted at half"),
    # NVIDIA H100 datasheet (SXM 80 GB): 67 TFLOPS FP32, 494.7 TFLOPS TF32 dense, 3.35 TB/s.
    DeviceSpec("H100", 67e12, 3.35e12, 80 * GiB, matmul_flops_per_s=494.7e12 * 0.5,
               source="NVIDIA H100 datasheet, SXM 80 GB; TF32 dense 494.7 TFLOPS counted at half"),
    # NVIDIA H200 datasheet (SXM 141 GB): same compute as H100 SXM, 4.8 TB/s HBM3e.
    DeviceSpec("H200", 67e12, 4.8e12, 141 * 10**9, matmul_flops_per_s=494.7e12 * 0.5,
               source="NVIDIA H200 datasheet, SXM 141 GB"),
    # Generic CPU = the development machine (2 vCPUs of an AMD EPYC with AVX-512), measured with
    # TensorFlow 2.15 (oneDNN) on 2026-11-22: ResNet-50's forward convolutions ran at 434 GFLOP/s
    # in total at batch 32 (their backprops at 240-270), so the peak is at least that: 2 vCPUs x
    # 64 FP32 FLOP/cycle (two 512-bit FMA pipes) x ~3.6 GHz = 460 GFLOP/s. A streaming
    # multiply+sum ran at 41 GB/s. 24 GB is the machine's RAM. Per-op fixed costs from the tiny
    # models' profiles: ~0.5 us for ops without work, ~3 us for small kernels.
    DeviceSpec("CPU", 460e9, 41e9, 24 * 10**9, compute_efficiency=0.6, memory_efficiency=0.8,
               launch_overhead_s=3e-6, host_op_overhead_s=0.5e-6,
               source="measured on the 2-vCPU AMD EPYC development machine (TF 2.15 oneDNN convolutions, streaming)"),
)}
ALIASES = {"1080Ti": "GTX1080Ti", "GTX_1080_Ti": "GTX1080Ti", "1080ti": "GTX1080Ti", "Tesla_V100": "V100"}
REFERENCE_KIND = "V100"


def device_spec(kind: str, source: str = "device model", field: str = "kind") -> DeviceSpec:
    """The table entry for `kind` (aliases allowed); InputError naming `field` if unknown."""
    spec = DEVICES.get(ALIASES.get(kind, kind)) if isinstance(kind, str) else None
    if spec is None:
        raise InputError(source, field, f"unknown device kind {kind!r}",
                         f"use one of {sorted(DEVICES)} (or add the device's datasheet figures to "
                         "tfplace.profiling.device_model.DEVICES)")
    return spec


# ---------------------------------------------------------------------------------------------
# Work per op
# ---------------------------------------------------------------------------------------------

# klass codes
HOST, MEMORY, COMPUTE, MATMUL = 0, 1, 2, 3
KLASS_NAMES = ("host", "memory", "compute", "matmul")

# Ops that launch no device kernel: no-ops, constants, handles, reads of resource variables (a
# reference, no copy), shape metadata, views (reshape/squeeze/identity alias their input).
HOST_OPS = frozenset({
    "NoOp", "Const", "HostConst", "VarHandleOp", "VariableV2", "Placeholder", "PlaceholderWithDefault",
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Snapshot", "ReadVariableOp",
    "Shape", "ShapeN", "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "BroadcastGradientArgs",
    "VarIsInitializedOp", "ControlTrigger", "_Arg", "_Retval", "Assert", "ConcatOffset",
    "EnsureShape", "CheckNumerics", "InvertPermutation", "Range", "DynamicStitch",
})
# Special functions (exp, log, tanh, rsqrt, ...) are counted as 4 FLOPs per element; every
# element-wise op is memory bound on every listed device, so the count hardly matters.
TRANSCENDENTAL = frozenset({
    "Exp", "Expm1", "Log", "Log1p", "Tanh", "Sigmoid", "Erf", "Erfc", "Rsqrt", "Sqrt", "Pow",
    "Softplus", "Softsign", "Elu", "Selu", "TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad",
    "EluGrad", "SeluGrad", "SoftplusGrad", "Sin", "Cos", "Tan", "Atan", "Reciprocal", "Inv",
    "ReciprocalGrad", "Gelu", "Xlogy", "Xdivy", "Lgamma", "Digamma",
})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin",
                        "EuclideanNorm", "BiasAddGrad", "L2Loss"})
# Data movement: 0 FLOPs; bytes = everything read + written.
MOVEMENT = frozenset({"Transpose", "ConjugateTranspose", "ConcatV2", "Concat", "Split", "SplitV", "Pack",
                      "Unpack", "Pad", "PadV2", "MirrorPad", "Tile", "Reverse", "ReverseV2", "BroadcastTo",
                      "DepthToSpace", "SpaceToDepth", "MatrixBandPart", "MatrixDiag", "Roll"})
# Reads only what they output (plus indices): 2 x output bytes + the other inputs.
GATHERS = frozenset({"GatherV2", "Gather", "ResourceGather", "GatherNd", "Slice", "StridedSlice"})
# Write only their output.
FILLS = frozenset({"Fill", "ZerosLike", "OnesLike", "OneHot", "Empty"})
RANDOM = frozenset({"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
                    "StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal",
                    "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2",
                    "StatelessRandomUniformIntV2", "StatelessRandomGetKeyCounter"})
# Optimizer updates: (index of the gradient input, FLOPs per parameter, tensors of the parameter's
# size read + written). E.g. SGD: var -= lr * g -> mul + sub = 2 FLOPs; reads var, g; writes var.
# Momentum: a = m*a + g; var -= lr*a -> 4 FLOPs; reads var, a, g; writes var, a.
# Adam: m, v updates (5), bias-corrected step lr*m/(sqrt(v)+eps) (4), var update (1) ~ 10 FLOPs;
# reads var, m, v, g; writes var, m, v.
OPTIMIZERS: Mapping[str, Tuple[int, float, int]] = {
    "ResourceApplyGradientDescent": (2, 2, 3), "ApplyGradientDescent": (2, 2, 3),
    "ResourceApplyMomentum": (3, 4, 5), "ApplyMomentum": (3, 4, 5),
    "ResourceApplyKerasMomentum": (3, 4, 5),
    "ResourceApplyAdam": (9, 10, 7), "ApplyAdam": (9, 10, 7),
    "ResourceApplyAdamWithAmsgrad": (10, 12, 9),
    "ResourceApplyRMSProp": (7, 8, 7), "ApplyRMSProp": (7, 8, 7),
    "ResourceApplyCenteredRMSProp": (8, 10, 9),
    "ResourceApplyAdagrad": (3, 5, 5), "ResourceApplyAdagradV2": (4, 5, 5), "ApplyAdagrad": (3, 5, 5),
    "ResourceApplyAdadelta": (6, 10, 7), "ResourceApplyFtrl": (4, 15, 7), "ResourceApplyFtrlV2": (4, 15, 7),
    "ResourceApplyAdaMax": (8, 8, 7), "ResourceApplyProximalGradientDescent": (4, 6, 3),
}
_NO_BYTES_DTYPES = frozenset({"resource", "variant", "string"})

Shape = Tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class OpWork:
    """Work of one op: FLOPs, bytes moved through device memory, and the roofline class."""
    flops: float
    bytes: float
    klass: int
    known: bool = True  # False: an op type without a formula (generic element-wise guess)


def _n(shape: Shape) -> float:
    return float(np.prod(shape)) if len(shape) else 1.0


def _nbytes(shape: Shape, dtype: str) -> float:
    if dtype in _NO_BYTES_DTYPES:
        return 0.0
    return _n(shape) * DTYPE_BYTES.get(dtype, 4)


def _window(attrs: Mapping[str, Any]) -> Optional[float]:
    ksize = attrs.get("ksize")
    if ksize:
        return float(np.prod([k for k in ksize]))
    return None


def _einsum_flops(equation: str, shapes: Sequence[Shape]) -> Optional[float]:
    """2 x product of the sizes of every distinct index (a contraction of two operands)."""
    try:
        lhs = equation.replace(" ", "").split("->")[0].split(",")
    except AttributeError:
        return None
    if len(lhs) != len(shapes):
        return None
    sizes: Dict[str, float] = {}
    for sub, shape in zip(lhs, shapes):
        if "..." in sub:
            head, tail = sub.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            letters = list(head) + [f"#{k}" for k in range(n_ell)] + list(tail)
        else:
            letters = list(sub)
        if len(letters) != len(shape):
            return None
        for letter, dim in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1.0), float(dim))
    return 2.0 * float(np.prod(list(sizes.values()))) if sizes else None


def op_work(op_type: str, in_shapes: Sequence[Shape], in_dtypes: Sequence[str],
            out_shapes: Sequence[Shape], out_dtypes: Sequence[str],
            attrs: Optional[Mapping[str, Any]] = None) -> OpWork:
    """FLOPs and bytes of one op from its tensor shapes (formulas in the comments below).

    Shapes are sequences of dimension sizes (floats allowed: a batch axis scaled to a per-device
    batch); unknown dimensions must already be replaced (e.g. by 1). attrs: the few attributes
    used (`ksize` of pooling, `is_training` of batch norm, `equation` of Einsum).
    """
    attrs = attrs or {}
    ins = [_nbytes(s, d) for s, d in zip(in_shapes, in_dtypes)]
    outs = [_nbytes(s, d) for s, d in zip(out_shapes, out_dtypes)]
    io_bytes = sum(ins) + sum(outs)
    n_out = _n(out_shapes[0]) if out_shapes else 0.0
    n_in0 = _n(in_shapes[0]) if in_shapes else 0.0
    t = op_type

    if t in HOST_OPS:
        return OpWork(0.0, 0.0, HOST)
    # Convolutions, filter [KH, KW, Cin, Cout] (3-D: [KD, KH, KW, Cin, Cout]): every output
    # element is a dot product of KH*KW*Cin pairs -> 2 * N(out) * KH*KW*Cin FLOPs. Both
    # backprops do the same multiply-adds, indexed by the forward output's gradient:
    #   BackpropInput (input_sizes, filter, dy):  2 * N(dy) * KH*KW*Cin
    #   BackpropFilter(input, filter_sizes, dy):  2 * N(dy) * KH*KW*Cin  (filter = its output)
    if t in ("Conv2D", "Conv3D", "_FusedConv2D", "_MklNativeConv2DWithBias"):
        filt = in_shapes[1]
        flops = 2.0 * n_out * _n(filt) / max(filt[-1], 1.0)
        return OpWork(flops + (n_out if t.startswith("_") else 0.0), io_bytes, MATMUL)
    if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
        filt, dy = in_shapes[1], in_shapes[2]
        return OpWork(2.0 * _n(dy) * _n(filt) / max(filt[-1], 1.0), io_bytes - ins[0], MATMUL)
    if t in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2"):
        filt, dy = out_shapes[0], in_shapes[2]
        return OpWork(2.0 * _n(dy) * _n(filt) / max(filt[-1], 1.0), io_bytes - ins[1], MATMUL)
    # Depthwise, filter [KH, KW, Cin, M]: each of the N(out) outputs sums KH*KW products.
    if t == "DepthwiseConv2dNative":
        filt = in_shapes[1]
        return OpWork(2.0 * n_out * filt[0] * filt[1], io_bytes, COMPUTE)
    if t == "DepthwiseConv2dNativeBackpropInput":
        filt, dy = in_shapes[1], in_shapes[2]
        return OpWork(2.0 * _n(dy) * filt[0] * filt[1], io_bytes - ins[0], COMPUTE)
    if t == "DepthwiseConv2dNativeBackpropFilter":
        filt, dy = out_shapes[0], in_shapes[2]
        return OpWork(2.0 * _n(dy) * filt[0] * filt[1], io_bytes - ins[1], COMPUTE)
    # MatMul: out [M, N], a is [M, K] or [K, M] (transpose_a) -> K = N(a) / M whatever the
    # transposes; FLOPs = 2 * M * N * K. Batched: out [..., M, N], K = a[-2] * a[-1] / M.
    if t in ("MatMul", "_FusedMatMul", "_MklMatMul", "SparseMatMul"):
        m = out_shapes[0][0] if out_shapes and out_shapes[0] else 1.0
        k = n_in0 / max(m, 1.0)
        return OpWork(2.0 * n_out * k, io_bytes, MATMUL)
    if t in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a, out = in_shapes[0], out_shapes[0]
        m = out[-2] if len(out) >= 2 else 1.0
        k = (a[-2] * a[-1] / max(m, 1.0)) if len(a) >= 2 else 1.0
        return OpWork(2.0 * n_out * k, io_bytes, MATMUL)
    if t == "Einsum":
        flops = _einsum_flops(attrs.get("equation", ""), in_shapes)
        return OpWork(flops if flops is not None else 2.0 * n_out, io_bytes, MATMUL, flops is not None)
    if t in OPTIMIZERS:
        gi, per_param, tensors = OPTIMIZERS[t]
        g = in_shapes[gi] if gi < len(in_shapes) else out_shapes[0]
        gbytes = ins[gi] if gi < len(ins) else 0.0
        return OpWork(per_param * _n(g), tensors * gbytes, MEMORY)
    if t.startswith("ResourceSparseApply") or t.startswith("SparseApply"):
        g = max(in_shapes, key=_n)
        return OpWork(4.0 * _n(g), 5.0 * max(ins), MEMORY, False)
    # Variable writes: assign = read value + write var; assign-add/sub also reads the var (1 FLOP).
    if t in ("AssignVariableOp", "Assign"):
        v = ins[-1] if ins else 0.0
        return OpWork(0.0, 2.0 * v, MEMORY)
    if t in ("AssignAddVariableOp", "AssignSubVariableOp", "AssignAdd", "AssignSub"):
        v = ins[-1] if ins else 0.0
        n = _n(in_shapes[-1]) if in_shapes else 0.0
        return OpWork(n, 3.0 * v, MEMORY)
    # Batch norm, training: pass 1 mean and variance (x, x-mean, square, add: 3 FLOPs/element),
    # pass 2 normalise + scale + shift (4/element) -> 7 N; reads x twice, writes y.
    # Inference (is_training false): y = x * a + b, 2 N. Gradient: sums of dy and dy*x_hat
    # (x_hat itself 2, products and sums 3), dx = g/sigma*(dy - mean(dy) - x_hat*mean(dy*x_hat))
    # (5/element) -> 10 N; reads x and dy twice, writes dx.
    if t in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "_MklFusedBatchNormV3"):
        nx, xb = n_in0, ins[0] if ins else 0.0
        if attrs.get("is_training", True):
            return OpWork(7.0 * nx, 3.0 * xb + sum(ins[1:]) + sum(outs[1:]), MEMORY)
        return OpWork(2.0 * nx, 2.0 * xb + sum(ins[1:]), MEMORY)
    if t in ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"):
        nx, xb = n_in0, ins[0] if ins else 0.0
        return OpWork(10.0 * nx, 5.0 * xb + sum(ins[2:]) + sum(outs[1:]), MEMORY)
    # Softmax: max, subtract, exp (4), sum, divide -> 8 per element; reads x twice, writes y.
    if t in ("Softmax", "LogSoftmax"):
        return OpWork(8.0 * n_in0, 2.0 * ins[0] + outs[0], MEMORY)
    # Cross-entropy with logits [N, C]: softmax (8) + log-likelihood and its gradient (2) per
    # logit -> 10 N C; reads logits (+ labels), writes loss [N] and backprop [N, C].
    if t in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
        return OpWork(10.0 * n_in0, io_bytes + ins[0], MEMORY)
    # Pooling: every output takes the max/mean of a KH*KW window -> N(out) * KH*KW.
    # Gradients: MaxPoolGrad(x, y, dy) re-finds each window's argmax (N(dy) * KH*KW compares)
    # and scatters; AvgPoolGrad(shape, dy) spreads each dy over its window (N(dy) * KH*KW).
    if t in ("MaxPool", "AvgPool", "MaxPoolV2", "MaxPool3D", "AvgPool3D"):
        w = _window(attrs)
        flops = n_out * w if w else n_in0
        return OpWork(flops, io_bytes, MEMORY)
    if t in ("MaxPoolGrad", "MaxPoolGradV2", "MaxPool3DGrad", "AvgPoolGrad", "AvgPool3DGrad"):
        dy = in_shapes[-1] if in_shapes else ()
        w = _window(attrs)
        flops = _n(dy) * w if w else n_out
        skip = ins[0] if t.startswith("AvgPool") else 0.0  # orig_input_shape is a small vector
        return OpWork(flops, io_bytes - skip, MEMORY)
    if t in REDUCTIONS:
        return OpWork((2.0 if t == "L2Loss" else 1.0) * n_in0, io_bytes, MEMORY)
    if t in MOVEMENT:
        return OpWork(0.0, io_bytes, MEMORY)
    if t in GATHERS:
        return OpWork(0.0, 2.0 * sum(outs) + sum(ins[1:]), MEMORY)
    if t in FILLS:
        return OpWork(0.0, sum(outs), MEMORY)
    if t in RANDOM:  # counter-based generators: ~8 integer/float ops per value
        return OpWork(8.0 * n_out, sum(outs), MEMORY)
    # AddN of k inputs: k - 1 additions per element.
    if t == "AddN":
        return OpWork(max(len(in_shapes) - 1, 1) * n_out, io_bytes, MEMORY)
    if t in ("UnsortedSegmentSum", "SegmentSum", "ScatterNd", "TensorScatterAdd", "TensorScatterUpdate",
             "StridedSliceGrad", "SliceGrad"):
        return OpWork(n_in0 if "Sum" in t or "Add" in t else 0.0, io_bytes, MEMORY)
    # Element-wise (unary, binary with broadcasting, activations and their gradients, casts,
    # comparisons, select): one result per output element, 1 FLOP (4 for special functions).
    per = 4.0 if t in TRANSCENDENTAL else 1.0
    known = t in _ELEMENTWISE or t in TRANSCENDENTAL
    return OpWork(per * n_out, io_bytes, MEMORY, known)


_ELEMENTWISE = frozenset({
    "Add", "AddV2", "Sub", "Mul", "Div", "RealDiv", "DivNoNan", "FloorDiv", "FloorMod", "Mod", "Maximum",
    "Minimum", "SquaredDifference", "Neg", "Abs", "Sign", "Square", "Floor", "Ceil", "Round", "Rint",
    "Relu", "Relu6", "LeakyRelu", "ReluGrad", "Relu6Grad", "LeakyReluGrad", "BiasAdd", "BiasAddV1",
    "Cast", "Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "Select", "SelectV2", "ClipByValue", "MulNoNan", "BitwiseAnd",
    "IsFinite", "IsNan", "OnesLike", "_MklAdd", "BiasAddGrad",
})


# ---------------------------------------------------------------------------------------------
# Work of a whole OpGraph
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpCosts:
    """Per-op work of one OpGraph at one per-device batch size (arrays indexed like names)."""
    batch_size: float
    flops: np.ndarray     # float64 [N]
    bytes: np.ndarray     # float64 [N]
    klass: np.ndarray     # int8 [N]: HOST / MEMORY / COMPUTE / MATMUL
    unknown_types: Tuple[str, ...]  # op types costed by the generic element-wise guess


@dataclasses.dataclass(frozen=True)
class _GraphIndex:
    inputs: Tuple[Tuple[int, ...], ...]   # per op: tensor ids by input port
    outputs: Tuple[Tuple[int, ...], ...]  # per op: tensor ids by output port
    attrs: Tuple[Mapping[str, Any], ...]


_INDEX: "weakref.WeakKeyDictionary[OpGraph, _GraphIndex]" = weakref.WeakKeyDictionary()
_HEAVY = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "BatchMatMulV2",
                    "BatchMatMulV3", "BatchMatMul", "DepthwiseConv2dNative", "Conv3D", "Einsum"})


def _graph_attrs(graph: OpGraph) -> Tuple[Mapping[str, Any], ...]:
    """The attributes op_work uses, read from graph.graph_def when it is there."""
    out: List[Mapping[str, Any]] = [{} for _ in graph.names]
    gd = graph.graph_def
    if gd is None:
        return tuple(out)
    wanted = {"MaxPool", "AvgPool", "MaxPoolGrad", "AvgPoolGrad", "MaxPool3D", "AvgPool3D", "MaxPool3DGrad",
              "AvgPool3DGrad", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "Einsum"}
    by_name = {n.name: n for n in gd.node if n.op in wanted}
    for i, name in enumerate(graph.names):
        node = by_name.get(name)
        if node is None:
            continue
        a: Dict[str, Any] = {}
        if "ksize" in node.attr:
            a["ksize"] = list(node.attr["ksize"].list.i)
        if "is_training" in node.attr:
            a["is_training"] = bool(node.attr["is_training"].b)
        if "equation" in node.attr:
            a["equation"] = node.attr["equation"].s.decode()
        out[i] = a
    return tuple(out)


def _index(graph: OpGraph) -> _GraphIndex:
    idx = _INDEX.get(graph)
    if idx is None:
        n = graph.num_ops
        ins: List[List[Tuple[int, int]]] = [[] for _ in range(n)]
        for t, d, p in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist(), graph.edge_dst_port.tolist()):
            ins[d].append((p, t))
        outs: List[List[Tuple[int, int]]] = [[] for _ in range(n)]
        for t, (o, p) in enumerate(zip(graph.tensor_op.tolist(), graph.tensor_port.tolist())):
            outs[o].append((p, t))
        idx = _GraphIndex(tuple(tuple(t for _, t in sorted(x)) for x in ins),
                          tuple(tuple(t for _, t in sorted(x)) for x in outs), _graph_attrs(graph))
        _check_shapes(graph, idx)
        _INDEX[graph] = idx
    return idx


def _check_shapes(graph: OpGraph, idx: _GraphIndex) -> None:
    """A graph whose conv/matmul tensors have unknown dimensions cannot be costed."""
    src = graph.source or "graph"
    for i, t in enumerate(graph.op_types):
        if t not in _HEAVY:
            continue
        for tid in idx.inputs[i] + idx.outputs[i]:
            shape = graph.tensor_shape[tid]
            if graph.tensor_dtype[tid] in _NO_BYTES_DTYPES:
                continue
            if any(d < 0 for d in shape):
                raise InputError(src, f"tensor_shape (op {graph.names[i]!r}, {t})",
                                 f"has unknown dimensions {tuple(shape)}",
                                 "export the graph with full shapes (the bundle's _output_shapes) and load it "
                                 "with tfplace.ir.loader.load_op_graph, which infers them")


def _check_batch(batch_size: Any, field: str = "batch_size", source: str = "device model") -> float:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.integer, np.floating)) \
            or not math.isfinite(batch_size) or batch_size <= 0:
        raise InputError(source, field, f"must be a positive number of samples, got {batch_size!r}",
                         "give the per-device batch size, e.g. 16")
    return float(batch_size)


def op_costs(graph: OpGraph, batch_size: float) -> OpCosts:
    """Work of every op when the step runs on `batch_size` samples (per device)."""
    b = _check_batch(batch_size)
    idx = _index(graph)
    scale = b / graph.reference_batch_size
    shapes: List[Shape] = []
    for shape, axis in zip(graph.tensor_shape, graph.tensor_batch_axis.tolist()):
        dims = [float(d) if d >= 0 else 1.0 for d in shape]
        if 0 <= axis < len(dims):
            dims[axis] *= scale
        shapes.append(tuple(dims))
    dtypes = graph.tensor_dtype
    n = graph.num_ops
    flops, nbytes, klass = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int8)
    unknown: Dict[str, None] = {}
    for i, t in enumerate(graph.op_types):
        ins, outs = idx.inputs[i], idx.outputs[i]
        w = op_work(t, [shapes[x] for x in ins], [dtypes[x] for x in ins],
                    [shapes[x] for x in outs], [dtypes[x] for x in outs], idx.attrs[i])
        k = w.klass
        # Small integer arithmetic (shape math in gradients) runs from host memory on GPUs.
        if k != HOST and w.bytes <= 256 and all(dtypes[x] in ("int32", "int64", "bool")
                                                for x in ins + outs if dtypes[x] not in _NO_BYTES_DTYPES):
            k = HOST
        flops[i], nbytes[i], klass[i] = w.flops, w.bytes, k
        if not w.known:
            unknown[t] = None
    return OpCosts(b, flops, nbytes, klass, tuple(unknown))


def roofline_parts(spec: DeviceSpec, costs: OpCosts) -> Tuple[np.ndarray, np.ndarray]:
    """(work_s, fixed_s) of every op on `spec`: the roofline max() of compute and memory time,
    and the fixed per-op cost (launch for kernels, host overhead for host ops)."""
    rate = np.where(costs.klass == MATMUL, spec.rate(True), spec.rate(False))
    work = np.maximum(costs.flops / rate, costs.bytes / (spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency))
    host = costs.klass == HOST
    return np.where(host, 0.0, work), np.where(host, spec.host_op_overhead_s, spec.launch_overhead_s)


def roofline_seconds(spec: DeviceSpec, costs: OpCosts) -> np.ndarray:
    """Roofline time of every op on `spec` (float64 [N]); see the module docstring."""
    work, fixed = roofline_parts(spec, costs)
    return work + fixed


def roofline_op_seconds(spec: DeviceSpec, work: OpWork) -> float:
    """Roofline time of one op's work on `spec`."""
    if work.klass == HOST:
        return spec.host_op_overhead_s
    rate = spec.rate(work.klass == MATMUL)
    return max(work.flops / rate, work.bytes / (spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency)) \
        + spec.launch_overhead_s


# ---------------------------------------------------------------------------------------------
# Profiles from the model
# ---------------------------------------------------------------------------------------------


def default_batch_sizes(graph: OpGraph) -> Tuple[int, ...]:
    """Powers of two up to the reference batch size, and the reference batch itself."""
    ref = graph.reference_batch_size
    out = {ref}
    b = 1
    while b < ref:
        out.add(b)
        b *= 2
    return tuple(sorted(out))


def _batches(batch_sizes: Optional[Sequence[int]], graph: OpGraph, source: str) -> Tuple[int, ...]:
    if batch_sizes is None:
        return default_batch_sizes(graph)
    if len(batch_sizes) == 0:
        raise InputError(source, "batch_sizes", "is empty", "give at least one per-device batch size")
    out = []
    for i, b in enumerate(batch_sizes):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0:
            raise InputError(source, f"batch_sizes[{i}]", f"must be a positive integer, got {b!r}",
                             "give per-device batch sizes >= 1, e.g. [8, 16, 32]")
        out.append(int(b))
    return tuple(sorted(set(out)))


def _kinds(kinds: Sequence[str], source: str) -> List[DeviceSpec]:
    if isinstance(kinds, str):
        kinds = [kinds]
    return [device_spec(k, source, f"kinds[{i}]") for i, k in enumerate(kinds)]


def _graph_label(graph: OpGraph) -> str:
    """Profile.graph of a profile made for `graph`: as every profile names it (formats.profile.graph_name)."""
    if graph.source:
        return graph_name(graph.source)
    return str(graph.meta.get("model", ""))


def roofline_profile(graph: OpGraph, kinds: Sequence[str], batch_sizes: Optional[Sequence[int]] = None) -> Profile:
    """A profile from the device model alone (nothing measured), for every op of `graph`.

    batch_sizes default: powers of two up to the graph's reference batch (interpolation covers
    the rest; the model is piecewise linear in the batch).
    """
    src = "roofline_profile"
    specs = _kinds(kinds, src)
    batches = _batches(batch_sizes, graph, src)
    per_batch = {b: op_costs(graph, b) for b in batches}
    ops: Dict[str, Dict[str, Tuple[Tuple[int, ...], Tuple[float, ...]]]] = {n: {} for n in graph.names}
    for spec in specs:
        cols = np.stack([roofline_seconds(spec, per_batch[b]) for b in batches], axis=1)
        for i, name in enumerate(graph.names):
            ops[name][spec.kind] = (batches, tuple(float(x) for x in cols[i]))
    unknown = sorted({t for c in per_batch.values() for t in c.unknown_types})
    return Profile(ops=ops, graph=_graph_label(graph),
                   conditions={"method": "roofline device model (tfplace.device_model)",
                               "specs": {s.kind: s.summary() for s in specs},
                               "generic_cost_op_types": unknown},
                   derived={s.kind: "roofline" for s in specs})


def _scale(t_from: np.ndarray, w_from: np.ndarray, f_from: np.ndarray, w_to: np.ndarray,
           f_to: np.ndarray) -> np.ndarray:
    """t_to = f_to + max(t_from - f_from, 0) * w_to / w_from; ops without roofline work scale by
    the fixed costs' ratio (a host op measured at 2x the host overhead stays at 2x)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = f_to + np.maximum(t_from - f_from, 0.0) * (w_to / w_from)
        no_work = t_from * f_to / f_from
    return np.where(w_from > 0, scaled, no_work)


def derive_profile(measured: Profile, graph: OpGraph, from_kind: str, to_kinds: Sequence[str],
                   batch_sizes: Optional[Sequence[int]] = None, from_spec: Optional[DeviceSpec] = None) -> Profile:
    """Profile for `to_kinds` scaled op by op from the `from_kind` measurements.

    t_to(op, b) = fixed_to + (t_from(op, b) - fixed_from) * work_to(op, b) / work_from(op, b)

    where work is the roofline max(compute, memory) time and fixed the per-op cost (launch, or
    host overhead for ops without work; those scale by the fixed costs' ratio). It is the
    roofline ratio applied to the part of the measured time that grows with the work: a small
    op whose measured time is mostly the source's per-op overhead (a 60 us oneDNN convolution of
    a 16x16 image) does not carry that overhead, multiplied, to a GPU; the op's inefficiency
    beyond its roofline work (a kernel at 30% of peak) does carry over.

    Ops the measurement lists as missing stay missing; graph ops neither measured nor listed
    get the plain roofline estimate (named in conditions["roofline_only_ops"]).

    Args:
      measured: a profile with `from_kind` measurements.
      graph: the OpGraph the profile was measured on (shapes for the work per op).
      from_kind: measured kind; its DeviceSpec comes from the table unless `from_spec` is given
        (e.g. a CPU measured with fewer threads than the table entry describes).
      to_kinds: kinds to derive.
      batch_sizes: per-device batch sizes of the result (default: the measured ones).
    """
    src = measured.source or "measured profile"
    src_spec = from_spec or device_spec(from_kind, src, "from_kind")
    specs = _kinds(to_kinds, "derive_profile")
    if from_kind not in measured.kinds:
        raise InputError(src, "ops", f"has no {from_kind!r} measurements (kinds: {list(measured.kinds)})",
                         f"measure the graph on a {from_kind} device or derive from one of the measured kinds")
    if batch_sizes is None:
        seen = {b for per in measured.ops.values() if from_kind in per for b in per[from_kind][0]}
        batch_sizes = sorted(seen)
    batches = _batches(batch_sizes, graph, "derive_profile")
    per_batch = {b: op_costs(graph, b) for b in batches}
    src_parts = [roofline_parts(src_spec, per_batch[b]) for b in batches]
    src_work = np.stack([w for w, _ in src_parts], axis=1)
    src_fixed = np.stack([f for _, f in src_parts], axis=1)
    missing = set(measured.missing_ops)
    ops: Dict[str, Dict[str, Tuple[Tuple[int, ...], Tuple[float, ...]]]] = {}
    roofline_only: List[str] = []
    still_missing: List[str] = []
    for spec in specs:
        parts = [roofline_parts(spec, per_batch[b]) for b in batches]
        work = np.stack([w for w, _ in parts], axis=1)
        fixed = np.stack([f for _, f in parts], axis=1)
        for i, name in enumerate(graph.names):
            if measured.has(name, from_kind):
                t_from = np.array([measured.seconds(name, from_kind, b) for b in batches])
                secs = _scale(t_from, src_work[i], src_fixed[i], work[i], fixed[i])
            elif name in missing:
                if spec is specs[0]:
                    still_missing.append(name)
                continue
            else:
                if spec is specs[0]:
                    roofline_only.append(name)
                secs = work[i] + fixed[i]
            ops.setdefault(name, {})[spec.kind] = (batches, tuple(float(x) for x in secs))
    return Profile(ops=ops, graph=measured.graph or _graph_label(graph),
                   conditions={"method": "fixed cost swapped, the rest x roofline work ratio (tfplace.device_model)",
                               "from_kind": from_kind, "from_spec": src_spec.summary(),
                               "specs": {s.kind: s.summary() for s in specs},
                               "roofline_only_ops": roofline_only},
                   missing_ops=tuple(still_missing), derived={s.kind: from_kind for s in specs},
                   comm=measured.comm)


# Share of a V100 step's roofline time in conv/matmul kernels, over the zoo models at their
# default batch (ResNet-50 0.63, BERT-base 0.63, Transformer 0.70, Inception-V3 0.77, VGG-19
# 0.93, MobileNet-V2 0.22): the graph-free speed weighs compute and memory rates 0.7 : 0.3.
COMPUTE_SHARE = 0.7


def relative_speed(kind: str, graph: Optional[OpGraph] = None, batch_size: Optional[float] = None) -> float:
    """Speed of `kind` relative to a V100 (V100 = 1; bigger is faster).

    Without a graph: a typical training step spends COMPUTE_SHARE of its V100 time in dense
    kernels (conv/matmul rate, TF32 where TF uses it) and the rest streaming memory, so
    speed = 1 / (COMPUTE_SHARE * r_ref/r + (1 - COMPUTE_SHARE) * bw_ref/bw). With a graph: the
    ratio of the whole step's roofline times at `batch_size` (default: its reference batch).
    """
    spec, ref = device_spec(kind), device_spec(REFERENCE_KIND)
    if graph is None:
        t = COMPUTE_SHARE * ref.rate(True) / spec.rate(True) + (1.0 - COMPUTE_SHARE) * (
            ref.memory_bandwidth_bytes_per_s * ref.memory_efficiency
            / (spec.memory_bandwidth_bytes_per_s * spec.memory_efficiency))
        return 1.0 / t
    costs = op_costs(graph, graph.reference_batch_size if batch_size is None else batch_size)
    return float(roofline_seconds(ref, costs).sum() / roofline_seconds(spec, costs).sum())


def device_speed(device) -> float:
    """relative_speed of one cluster device (a tfplace.formats.cluster.Device): its kind's; for a
    CPU kind the device table lacks whose device runs under a declared CPU quota (the cluster file's
    `emulation.cpu_fraction`, e.g. kind "CPU_half"), a CPU's times that fraction (the quota's
    nominal slowdown). Raises InputError for any other unknown kind."""
    from tfplace.formats.cluster import is_cpu_kind
    fraction = device.emulation.cpu_fraction if device.emulation is not None else None
    if fraction is not None and is_cpu_kind(device.kind) and device.kind not in DEVICES:
        return relative_speed("CPU") * float(fraction)
    return relative_speed(device.kind)


def _known(kind: str) -> bool:
    """Whether the device table has `kind` (aliases allowed)."""
    return ALIASES.get(kind, kind) in DEVICES


def default_profile_label(profile, cluster) -> str:
    """How the commands name a profile that cluster_profile made for `cluster`: the bundled
    measured profile it scaled per kind, or the roofline model, and the CPU kinds it rates by
    their quota."""
    bundled = profile.conditions.get("bundled") if isinstance(profile.conditions, dict) else None
    label = f"device model ({'bundled ' + bundled + ' scaled per kind' if bundled else 'roofline'}"
    return label + "".join(f"; {k} = CPU at a {f:g} quota" for k, f in quota_kinds(cluster).items()) + ")"


def quota_kinds(cluster) -> Dict[str, float]:
    """CPU kinds the device table lacks whose devices all run under one declared CPU quota
    ("CPU_half" at cpu_fraction 0.5, clusters/local_cpu_hetero.json) -> that fraction: a whole CPU
    slowed by the quota, as device_speed rates them."""
    from tfplace.formats.cluster import is_cpu_kind
    out: Dict[str, float] = {}
    for kind in cluster.kinds:
        if _known(kind):
            continue
        fractions = {d.emulation.cpu_fraction if d.emulation else None for d in cluster.devices if d.kind == kind}
        if is_cpu_kind(kind) and len(fractions) == 1 and None not in fractions:
            out[kind] = fractions.pop()
    return out


def check_known_kinds(cluster) -> None:
    """Raises InputError naming the cluster file and the device when the device model cannot give
    a profile of its kind (not in the device table, and not a CPU kind under a declared quota)."""
    quota = quota_kinds(cluster)
    for i, d in enumerate(cluster.devices):
        if not _known(d.kind) and d.kind not in quota:
            raise InputError(cluster.source or cluster.name, f"devices[{i}].kind",
                             f"the device model does not know the kind {d.kind!r} (known: {sorted(DEVICES)}; a CPU "
                             "kind under a declared CPU quota is a CPU slowed by it)",
                             "measure a profile on the cluster (python -m tfplace.profile --graph G --cluster C "
                             "--out P) and give it (--profile P; a train config's \"profiles\"), or use a known kind")


def cluster_profile(graph: OpGraph, cluster) -> Profile:
    """The device model's profile of every kind of `cluster` (a tfplace.formats.cluster.Cluster),
    what every command uses without --profile: default_profile for the kinds of the device table; a
    quota kind (quota_kinds) gets the CPU kind's op times over its quota (the quota's nominal
    slowdown; `python -m tfplace.profile --cluster C` measures the real one). Raises InputError
    naming the cluster file and the device for any other kind the device table lacks."""
    from tfplace.profiling.profiler import merge_profiles, scaled_kind
    check_known_kinds(cluster)
    quota = quota_kinds(cluster)
    known = [k for k in cluster.kinds if k not in quota]
    profile = default_profile(graph, known + (["CPU"] if quota and "CPU" not in known else []))
    for kind, fraction in quota.items():
        cpu = dataclasses.replace(profile, ops={op: {kind: per["CPU"]} for op, per in profile.ops.items()
                                                 if "CPU" in per}, derived={kind: "CPU"}, conditions={})
        profile = merge_profiles(profile, scaled_kind(cpu, kind, 1.0 / fraction))
    return profile


# ---------------------------------------------------------------------------------------------
# Bundled profiles
# ---------------------------------------------------------------------------------------------

def bundled_profiles_dir() -> str:
    """graph_defs/profiles: beside tfplace/ in a checkout, inside it (tfplace/graph_defs) when
    installed. Located by path, not imported: the core does not depend on the model zoo."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfplace/profiling/ -> tfplace/
    for cand in (os.path.join(os.path.dirname(package), "graph_defs", "profiles"),
                 os.path.join(package, "graph_defs", "profiles")):
        if os.path.isdir(cand):
            return cand
    return os.path.join(os.path.dirname(package), "graph_defs", "profiles")


def bundled_profile_path(graph: OpGraph) -> Optional[str]:
    """The bundled measured profile for this graph's model and options, if there is one."""
    label = _graph_label(graph)
    if not label:
        return None
    path = os.path.join(bundled_profiles_dir(), f"{label}.json")
    return path if os.path.exists(path) else None


def default_profile(graph: OpGraph, kinds: Sequence[str], batch_sizes: Optional[Sequence[int]] = None) -> Profile:
    """A profile for `kinds` without measuring anything now.

    Uses the bundled profile of the graph (graph_defs/profiles/<stem without batch>.json) when
    there is one: its measured and derived kinds as they are, any other requested kind derived
    from its measured kind. Without a bundled profile, the roofline model (`roofline_profile`).
    Ops the bundled profile does not cover get the roofline estimate (conditions name them).
    """
    from tfplace.formats.profile import load_profile  # plain JSON reading; no TensorFlow
    specs = _kinds(kinds, "default_profile")
    path = bundled_profile_path(graph)
    if path is None:
        return roofline_profile(graph, [s.kind for s in specs], batch_sizes)
    bundled = load_profile(path)
    measured_kinds = [k for k in bundled.kinds if k not in bundled.derived]
    have = [s.kind for s in specs if s.kind in bundled.kinds]
    need = [s.kind for s in specs if s.kind not in bundled.kinds]
    ops: Dict[str, Dict[str, Tuple[Tuple[int, ...], Tuple[float, ...]]]] = {}
    for name in graph.names:
        per = bundled.ops.get(name, {})
        ops[name] = {k: per[k] for k in have if k in per}
    derived = {k: bundled.derived.get(k, "measured") for k in have}
    if need and measured_kinds:
        extra = derive_profile(bundled, graph, measured_kinds[0], need, batch_sizes)
        for name, per in extra.ops.items():
            ops.setdefault(name, {}).update(per)
        derived.update(extra.derived)
    elif need:
        extra = roofline_profile(graph, need, batch_sizes)
        for name, per in extra.ops.items():
            ops.setdefault(name, {}).update(per)
        derived.update(extra.derived)
    missing = set(bundled.missing_ops)
    filled = [n for n, per in ops.items() if len(per) < len(specs) and n not in missing]
    if filled:
        fill = roofline_profile(graph, [s.kind for s in specs], batch_sizes)
        for n in filled:
            for k, pts in fill.ops[n].items():
                ops[n].setdefault(k, pts)
    ops = {n: per for n, per in ops.items() if per}
    return Profile(ops=ops, graph=bundled.graph, conditions={"bundled": os.path.basename(path),
                                                             "roofline_filled_ops": filled},
                   missing_ops=tuple(m for m in bundled.missing_ops if m not in ops), derived=derived,
                   source=path)
