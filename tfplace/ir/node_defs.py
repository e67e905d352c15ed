"""NodeDef builders shared by the rewrite (tfplace.rewrite) and the profilers (tfplace.profiling):
NodeDefs, constants, concatenation, sums, and the all-reduce as the rewrite emits it (one
CollectiveReduceV2 per participant, or the exchange of shards over Send/Recv that CPU devices
use), with `import_all_reduce` to put the same nodes into a graph being built. They build
protos and decide nothing about a strategy. All builders take the full TF device string of the
device the node runs on.
"""

from __future__ import annotations

import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

# packed pieces and the exchange's shards start and end on multiples of this many elements (64
# bytes of float32): TensorFlow's SplitV hands out views of its input only when every piece
# starts and ends aligned, and copies all of them otherwise (ResNet-50's 100 MB of gradients, on
# every participant)
SHARD_ALIGN_ELEMENTS = 16
# how an all-reduce among CPU devices is emitted; the first is the default (graph_rewrite.rewrite_step)
CPU_ALL_REDUCE = ("exchange", "collective")


def _tf():
    import tensorflow as tf  # deferred so that importing tfplace stays TF-free
    return tf


def dtype_enum(dtype_name: str) -> int:
    return _tf().as_dtype(dtype_name).as_datatype_enum


def dtype_size(dtype_name: str) -> int:
    """Bytes per element of a TF dtype name."""
    return _tf().as_dtype(dtype_name).size


def node(name: str, op: str, device: str, inputs: Sequence[str] = (), **attrs):
    """A NodeDef; attrs are AttrValue protos or python values (int/float/str/bool/dtype enum via
    the `type_` prefix: `type_T=enum`)."""
    from tensorflow.core.framework import attr_value_pb2, node_def_pb2
    n = node_def_pb2.NodeDef(name=name, op=op, device=device)
    n.input.extend(inputs)
    for key, value in attrs.items():
        if key.startswith("type_"):
            n.attr[key[5:]].CopyFrom(attr_value_pb2.AttrValue(type=value))
        elif isinstance(value, attr_value_pb2.AttrValue):
            n.attr[key].CopyFrom(value)
        elif isinstance(value, bool):
            n.attr[key].b = value
        elif isinstance(value, int):
            n.attr[key].i = value
        elif isinstance(value, float):
            n.attr[key].f = value
        elif isinstance(value, str):
            n.attr[key].s = value.encode()
        else:
            raise TypeError(f"attr {key}: unsupported value {value!r}")
    return n


def const(name: str, device: str, value, dtype_name: str):
    tf = _tf()
    from tensorflow.core.framework import attr_value_pb2
    proto = tf.make_tensor_proto(np.asarray(value, dtype=tf.as_dtype(dtype_name).as_numpy_dtype))
    return node(name, "Const", device, value=attr_value_pb2.AttrValue(tensor=proto),
                type_dtype=dtype_enum(dtype_name))


def concat(name: str, device: str, srcs: Sequence[str], axis: int, dtype_name: str) -> List:
    if len(srcs) == 1:
        return [node(name, "Identity", device, [srcs[0]], type_T=dtype_enum(dtype_name))]
    return [const(name + "/axis", device, axis, "int32"),
            node(name, "ConcatV2", device, list(srcs) + [name + "/axis"], N=len(srcs),
                 type_T=dtype_enum(dtype_name), type_Tidx=dtype_enum("int32"))]


def identity(name: str, device: str, src: str, dtype_name: str):
    return node(name, "Identity", device, [src], type_T=dtype_enum(dtype_name))


def add_n(name: str, device: str, srcs: Sequence[str], dtype_name: str):
    if len(srcs) == 1:
        return identity(name, device, srcs[0], dtype_name)
    return node(name, "AddN", device, list(srcs), N=len(srcs), type_T=dtype_enum(dtype_name))


def no_op(name: str, device: str, control: Sequence[str]):
    return node(name, "NoOp", device, ["^" + c for c in dict.fromkeys(control)])


def group_key(devices: Sequence[str]) -> int:
    """A stable collective group key per participant set (TF requires one device set per key)."""
    return 1 + zlib.crc32("|".join(sorted(devices)).encode()) % (2 ** 30)


def all_reduce(name: str, device: str, src: str, size: int, gkey: int, ikey: int, dtype_name: str,
               nccl: bool) -> List:
    """One participant of a sum all-reduce (CollectiveReduceV2, merge Add, final Id)."""
    return [const(name + "/group_size", device, size, "int32"), const(name + "/group_key", device, gkey, "int32"),
            const(name + "/instance_key", device, ikey, "int32"),
            node(name, "CollectiveReduceV2", device,
                 [src, name + "/group_size", name + "/group_key", name + "/instance_key"],
                 type_T=dtype_enum(dtype_name), merge_op="Add", final_op="Id",
                 communication_hint="nccl" if nccl else "auto", Nordering_token=0)]


def padding_elements(elements: int) -> int:
    """Zeros `pack` puts after a piece of `elements` elements so that the next piece starts on a
    multiple of SHARD_ALIGN_ELEMENTS (0 for an unknown size, given as a negative number)."""
    return (-int(elements)) % SHARD_ALIGN_ELEMENTS if elements >= 0 else 0


def pack(name: str, device: str, srcs: Sequence[str], dtype_name: str, pads: Optional[Sequence[int]] = None) -> List:
    """`name/packed`: the sources flattened and concatenated, in order (a 1-D tensor), source i
    followed by pads[i] zeros (`padding_elements`: every piece then starts and ends aligned, so
    that splitting the packed tensor again hands out views instead of copies)."""
    i32, T = dtype_enum("int32"), dtype_enum(dtype_name)
    pads = list(pads) if pads is not None else [0] * len(srcs)
    out = [const(name + "/flat_shape", device, [-1], "int32")]
    inputs = []
    for i, src in enumerate(srcs):
        out.append(node(f"{name}/flat_{i}", "Reshape", device, [src, name + "/flat_shape"], type_T=T, type_Tshape=i32))
        inputs.append(f"{name}/flat_{i}")
        if pads[i] > 0:
            zeros = f"{name}/zeros_{pads[i]}"
            if zeros not in inputs:
                out.append(const(zeros, device, np.zeros(pads[i]), dtype_name))
            inputs.append(zeros)
    return out + concat(name + "/packed", device, inputs, 0, dtype_name)


def unpack(name: str, device: str, flat: str, srcs: Sequence[str], out_names: Sequence[str], dtype_name: str,
           pads: Optional[Sequence[int]] = None, shapes: Optional[Sequence[Sequence[int]]] = None) -> List:
    """The inverse of `pack` (same sources and pads) applied to `flat` (a tensor of the packed
    length): `name/<out_names[i]>` has the shape of srcs[i]; sizes and shapes are read from the
    sources at run time, or, given `shapes` (each source's static shape), are constants, so that
    `device` need not read the sources (a receiver on another device). The split takes each
    source with its padding (a view when aligned); a padded piece is then cut to its size (a copy
    of that piece alone)."""
    i32, T = dtype_enum("int32"), dtype_enum(dtype_name)
    pads = list(pads) if pads is not None else [0] * len(srcs)
    out, sizes = [], []
    for i, src in enumerate(srcs):
        if shapes is None:
            out += [node(f"{name}/size_{i}", "Size", device, [src], type_T=T, type_out_type=i32),
                    node(f"{name}/shape_{i}", "Shape", device, [src], type_T=T, type_out_type=i32)]
        else:
            out += [const(f"{name}/size_{i}", device, int(np.prod(shapes[i], dtype=np.int64)), "int32"),
                    const(f"{name}/shape_{i}", device, [int(x) for x in shapes[i]], "int32")]
        sizes.append(f"{name}/size_{i}")
        if pads[i] > 0:
            out += [const(f"{name}/pad_{i}", device, pads[i], "int32"),
                    node(f"{name}/padded_size_{i}", "AddV2", device, [f"{name}/size_{i}", f"{name}/pad_{i}"],
                         type_T=i32)]
            sizes[-1] = f"{name}/padded_size_{i}"
    out += [node(name + "/sizes", "Pack", device, sizes, N=len(sizes), type_T=i32, axis=0),
            const(name + "/split_axis", device, 0, "int32"),
            node(name + "/split", "SplitV", device, [flat, name + "/sizes", name + "/split_axis"],
                 num_split=len(sizes), type_T=T, type_Tlen=i32)]
    for i, piece in enumerate(out_names):
        src = f"{name}/split:{i}"
        if pads[i] > 0:
            out += [const(f"{name}/begin_{i}", device, [0], "int32"),
                    node(f"{name}/length_{i}", "Reshape", device, [f"{name}/size_{i}", name + "/flat_shape_1"],
                         type_T=i32, type_Tshape=i32),
                    node(f"{name}/cut_{i}", "Slice", device, [src, f"{name}/begin_{i}", f"{name}/length_{i}"],
                         type_T=T, type_Index=i32)]
            src = f"{name}/cut_{i}"
        out.append(node(f"{name}/{piece}", "Reshape", device, [src, f"{name}/shape_{i}"], type_T=T, type_Tshape=i32))
    if any(p > 0 for p in pads):
        out.append(const(name + "/flat_shape_1", device, [1], "int32"))
    return out


def packed_send(name: str, src_device: str, dst_device: str, srcs: Sequence[str], out_names: Sequence[str],
                dtype_name: str, shapes: Sequence[Sequence[int]]) -> List:
    """Several tensors of static `shapes` moved as one: packed on `src_device` (aligned pieces,
    `padding_elements`), split on `dst_device` into `name/<out_names[i]>` with constant sizes and
    shapes, so the receiver reads nothing else of the sender's (a PS bucket)."""
    pads = [padding_elements(int(np.prod(x, dtype=np.int64))) for x in shapes]
    return (pack(name, src_device, srcs, dtype_name, pads)
            + unpack(name, dst_device, name + "/packed", srcs, out_names, dtype_name, pads, shapes=shapes))


def bucket_all_reduce(name: str, device: str, srcs: Sequence[str], out_names: Sequence[str], size: int, gkey: int,
                      ikey: int, dtype_name: str, nccl: bool, pads: Optional[Sequence[int]] = None) -> List:
    """One participant of a sum all-reduce of several tensors at once: each flattened, all
    concatenated, one CollectiveReduceV2 (`name`), split back into pieces and reshaped to each
    source's shape as `name/<out_names[i]>` (every participant lists the same tensors in the same
    order; `pads` as in `pack`)."""
    return (pack(name, device, srcs, dtype_name, pads)
            + all_reduce(name, device, name + "/packed", size, gkey, ikey, dtype_name, nccl)
            + unpack(name, device, name, srcs, out_names, dtype_name, pads))


def exchange_all_reduce(names: Sequence[str], devices: Sequence[str], srcs: Sequence[Sequence[str]],
                        out_names: Optional[Sequence[str]], dtype_name: str,
                        pads: Optional[Sequence[int]] = None, elements: Optional[Sequence[int]] = None) -> List:
    """A sum all-reduce over Send/Recv among n participants (reduce-scatter, then all-gather):
    participant i packs its tensors `srcs[i]` (on `devices[i]`) into one 1-D tensor and cuts it
    into n shards (of a multiple of SHARD_ALIGN_ELEMENTS elements; the last takes the rest);
    shard j of every participant is summed on participant j (AddN, in participant order); each
    participant concatenates the n sums as `names[i]` and unpacks them as
    `names[i]/<out_names[k]>`. With out_names None (one tensor),
    `names[i]` is the sum in its source's shape. `pads`: as in `pack` (with them every shard
    starts and ends aligned and is a view, not a copy). Every participant ends with the same values.
    Each shard crosses between two tasks twice, as in a ring, in two rounds of parallel messages
    instead of 2(n-1) steps of a ring. Given `elements` (each source's element count, the same on
    every participant), the shard bounds are known when the graph is built and nothing gathers
    the n sums into one tensor: each output is sliced out of the sums that hold it (a view where
    aligned; a concatenation of its own pieces only where it straddles two shards), and `names[i]`
    is then a NoOp after every output and the shard summed on devices[i] (or, with out_names None,
    the sum itself, after that shard)."""
    i32, T = dtype_enum("int32"), dtype_enum(dtype_name)
    n = len(devices)
    out: List = []
    for name, dev, parts in zip(names, devices, srcs):
        out += pack(name, dev, parts, dtype_name, pads)
        out += [node(name + "/length", "Size", dev, [name + "/packed"], type_T=T, type_out_type=i32),
                const(name + "/parts_x_align", dev, n * SHARD_ALIGN_ELEMENTS, "int32"),
                const(name + "/align", dev, SHARD_ALIGN_ELEMENTS, "int32"),
                const(name + "/parts_but_one", dev, n - 1, "int32"),
                node(name + "/aligned_shards", "FloorDiv", dev, [name + "/length", name + "/parts_x_align"],
                     type_T=i32),
                node(name + "/shard", "Mul", dev, [name + "/aligned_shards", name + "/align"], type_T=i32),
                node(name + "/shards_but_one", "Mul", dev, [name + "/shard", name + "/parts_but_one"], type_T=i32),
                node(name + "/last_shard", "Sub", dev, [name + "/length", name + "/shards_but_one"], type_T=i32),
                node(name + "/shard_sizes", "Pack", dev, [name + "/shard"] * (n - 1) + [name + "/last_shard"], N=n,
                     type_T=i32, axis=0),
                const(name + "/shard_axis", dev, 0, "int32"),
                node(name + "/shards", "SplitV", dev, [name + "/packed", name + "/shard_sizes", name + "/shard_axis"],
                     num_split=n, type_T=T, type_Tlen=i32)]
    sums = [f"{names[j]}/shard_sum" for j in range(n)]
    for j, dev in enumerate(devices):
        out.append(add_n(sums[j], dev, [f"{names[i]}/shards:{j}" for i in range(n)], dtype_name))
    for i, (name, dev, parts) in enumerate(zip(names, devices, srcs)):
        if elements is not None:
            pieces = ["value"] if out_names is None else list(out_names)
            out += _slice_sums(name, dev, sums, parts, pieces, dtype_name, pads, elements)
            # names[i] also waits for the shard summed on its own device, which an output may
            # not read (a bucket smaller than n aligned pieces lies in the last shard): every
            # participant of a fetched all-reduce then runs all of it, as TF prunes the rest
            if out_names is None:
                last = identity(name, dev, name + "/value", dtype_name)
                last.input.append("^" + sums[i])
            else:
                last = no_op(name, dev, [f"{name}/{x}" for x in pieces] + [sums[i]])
            out.append(last)
        elif out_names is None:
            out += concat(name + "/sum", dev, sums, 0, dtype_name)
            out += unpack(name, dev, name + "/sum", parts, ["value"], dtype_name, pads)
            out.append(identity(name, dev, name + "/value", dtype_name))
        else:
            out += concat(name, dev, sums, 0, dtype_name)
            out += unpack(name, dev, name, parts, out_names, dtype_name, pads)
    return out


def shard_bounds(length: int, n: int) -> List[Tuple[int, int]]:
    """[start, end) of the n shards `exchange_all_reduce` cuts a packed tensor of `length`
    elements into: n-1 of a multiple of SHARD_ALIGN_ELEMENTS, the last with the rest."""
    shard = length // (n * SHARD_ALIGN_ELEMENTS) * SHARD_ALIGN_ELEMENTS
    return [(j * shard, (j + 1) * shard if j < n - 1 else length) for j in range(n)]


def _slice_sums(name: str, device: str, sums: Sequence[str], srcs: Sequence[str], out_names: Sequence[str],
                dtype_name: str, pads: Optional[Sequence[int]], elements: Sequence[int]) -> List:
    """`name/<out_names[k]>`: source k's sum, cut out of the shard sums (`sums`, in shard order)
    at the offsets `pack` gave it, and reshaped like srcs[k]."""
    i32, T = dtype_enum("int32"), dtype_enum(dtype_name)
    pads = list(pads) if pads is not None else [0] * len(srcs)
    spans, at = [], 0
    for e, pad in zip(elements, pads):
        spans.append((at, at + int(e) + int(pad)))
        at += int(e) + int(pad)
    bounds = shard_bounds(at, len(sums))
    out: List = []
    for k, ((lo, hi), src, piece) in enumerate(zip(spans, srcs, out_names)):
        base = f"{name}/{piece}"
        cuts = []
        for j, (a, b) in enumerate(bounds):
            if max(lo, a) < min(hi, b) or (lo == hi and j == len(bounds) - 1 and not cuts):  # (an empty source)
                cut = f"{base}/from_shard_{j}"
                out += [const(cut + "/begin", device, [max(0, max(lo, a) - a)], "int32"),
                        const(cut + "/size", device, [max(0, min(hi, b) - max(lo, a))], "int32"),
                        node(cut, "Slice", device, [sums[j], cut + "/begin", cut + "/size"], type_T=T, type_Index=i32)]
                cuts.append(cut)
        flat = cuts[0] if len(cuts) == 1 else base + "/joined"
        if len(cuts) > 1:
            out += concat(flat, device, cuts, 0, dtype_name)
        if pads[k] > 0:
            out += [const(base + "/begin", device, [0], "int32"), const(base + "/size", device, [int(elements[k])], "int32"),
                    node(base + "/cut", "Slice", device, [flat, base + "/begin", base + "/size"], type_T=T, type_Index=i32)]
            flat = base + "/cut"
        out += [node(base + "/shape", "Shape", device, [src], type_T=T, type_out_type=i32),
                node(base, "Reshape", device, [flat, base + "/shape"], type_T=T, type_Tshape=i32)]
    return out


def import_all_reduce(values, devices: Sequence[str], dtype_name: str, implementation: str, gkey: int,
                      ikey: int, name: str) -> list:
    """Graph mode, for the profilers: all-reduces the TF tensors `values` (values[i] on devices[i])
    with the nodes the rewrite emits for `implementation` ("exchange": `exchange_all_reduce`;
    "collective": `all_reduce`), imported into the default graph under the prefix `name`.
    Returns the summed tensors in participant order."""
    tf = _tf()
    from tensorflow.core.framework import graph_pb2
    ins = [f"in_{i}" for i in range(len(devices))]
    outs = [f"d{i}" for i in range(len(devices))]
    gd = graph_pb2.GraphDef()
    gd.node.extend(node(x, "Placeholder", d, type_dtype=dtype_enum(dtype_name)) for x, d in zip(ins, devices))
    if implementation == "exchange":
        shape = values[0].shape  # known: the rewrite's form, the sums sliced out of the shards
        elements = [int(shape.num_elements())] if shape.is_fully_defined() else None
        gd.node.extend(exchange_all_reduce(outs, devices, [[x] for x in ins], None, dtype_name, elements=elements))
    elif implementation == "collective":
        for o, d, x in zip(outs, devices, ins):
            gd.node.extend(all_reduce(o, d, x, len(devices), gkey, ikey, dtype_name, False))
    else:
        raise ValueError(f"unknown all-reduce implementation {implementation!r}")
    return tf.compat.v1.import_graph_def(gd, input_map={f"{x}:0": v for x, v in zip(ins, values)},
                                         return_elements=[o + ":0" for o in outs], name=name)
