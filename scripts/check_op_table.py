#!/usr/bin/env python3
"""Checks every TT_LIBTORCH_OP row of runtime/include/tt/ops.def against
PyTorch (run with /usr/bin/python3, Debian's python3-torch): storage (view /
fresh / may-alias), result layout (contiguous / same as self / permuted) and
whether autograd records the op. Exit 0 all agree, 1 a row disagrees or has
no probe, 2 PyTorch is missing."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROW = re.compile(r"^TT_LIBTORCH_OP\((\w+),\s*(\w+),\s*(\w+),\s*(\w+)\)", re.M)


def probes(torch, F):
    """name -> f(x), x a float [3, 4, 5, 6] tensor (transposed from [3, 5, 4, 6]
    for the Contiguous and Same rows, contiguous for the views)."""
    i64 = lambda *s: torch.zeros(*s, dtype=torch.long)
    return {
        "moveaxis": lambda t: t.moveaxis(1, 2), "movedim": lambda t: t.movedim(1, 2),
        "mT": lambda t: t.mT, "swapaxes": lambda t: t.swapaxes(1, 2),
        "swapdims": lambda t: t.swapdims(1, 2),
        "split_with_sizes": lambda t: t.split_with_sizes([2, 4], -1)[0],
        "tensor_split": lambda t: t.tensor_split(2, -1)[0],
        "unflatten": lambda t: t.unflatten(-1, (2, 3)), "unfold": lambda t: t.unfold(-1, 2, 1),
        "broadcast_to": lambda t: t.broadcast_to((2,) + tuple(t.shape)),
        "toType": lambda t: t.type(t.dtype), "type_as": lambda t: t.type_as(t),
        "addcdiv": lambda t: t.addcdiv(t, t.abs() + 1), "addcmul": lambda t: t.addcmul(t, t),
        "ceil": torch.ceil, "clamp_max": lambda t: t.clamp_max(0), "clamp_min": lambda t: t.clamp_min(0),
        "cos": torch.cos, "dropout": lambda t: F.dropout(t, 0.5, True), "elu": F.elu, "erf": torch.erf,
        "expm1": torch.expm1, "flip": lambda t: t.flip(-1), "floor": torch.floor,
        "fmod": lambda t: t.fmod(2), "gelu": F.gelu, "hardsigmoid": F.hardsigmoid,
        "hardswish": F.hardswish, "hardtanh": F.hardtanh, "isinf": torch.isinf, "isnan": torch.isnan,
        "leaky_relu": F.leaky_relu, "lerp": lambda t: t.lerp(t * 2, 0.5), "log1p": lambda t: t.abs().log1p(),
        "logical_and": lambda t: torch.logical_and(t, t), "logical_not": torch.logical_not,
        "maximum": lambda t: torch.maximum(t, t), "minimum": lambda t: torch.minimum(t, t),
        "mish": F.mish, "nan_to_num": torch.nan_to_num, "normalize": lambda t: F.normalize(t, dim=-1),
        "reciprocal": torch.reciprocal, "relu6": F.relu6, "remainder": lambda t: t.remainder(2),
        "round": torch.round, "rsqrt": lambda t: t.abs().rsqrt(), "selu": F.selu, "sign": torch.sign,
        "silu": F.silu, "sin": torch.sin, "softplus": F.softplus, "softsign": F.softsign,
        "square": torch.square,
        "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, 1), "amax": lambda t: t.amax(-1),
        "amin": lambda t: t.amin(-1), "avg_pool2d": lambda t: F.avg_pool2d(t, 2),
        "batch_norm": lambda t: F.batch_norm(t, None, None, training=True),
        "binary_cross_entropy": lambda t: F.binary_cross_entropy(t.sigmoid(), t.sigmoid().detach()),
        "binary_cross_entropy_with_logits": lambda t: F.binary_cross_entropy_with_logits(t, t.detach()),
        "cat": lambda t: torch.cat([t, t], 0), "cdist": lambda t: torch.cdist(t, t),
        "conv1d": lambda t: F.conv1d(t.flatten(0, 1), torch.randn(2, 5, 1)),
        "conv2d": lambda t: F.conv2d(t, torch.randn(2, 4, 1, 1)),
        "cross_entropy": lambda t: F.cross_entropy(t.flatten(0, 2), i64(60)),
        "cumprod": lambda t: t.cumprod(-1), "cumsum": lambda t: t.cumsum(-1),
        "embedding": lambda t: F.embedding(i64(3, 4), t.flatten(0, 2)),
        "gather": lambda t: t.gather(-1, i64(3, 4, 5, 2)), "group_norm": lambda t: F.group_norm(t, 1),
        "index_select": lambda t: t.index_select(1, torch.tensor([0, 1])),
        "instance_norm": lambda t: F.instance_norm(t), "interpolate": lambda t: F.interpolate(t, scale_factor=2.0),
        "l1_loss": lambda t: F.l1_loss(t, t.detach()), "layer_norm": lambda t: F.layer_norm(t, [6]),
        "linear": lambda t: F.linear(t, torch.randn(2, 6)), "log_sigmoid": F.logsigmoid,
        "log_softmax": lambda t: t.log_softmax(-1), "logsumexp": lambda t: t.logsumexp(-1),
        "masked_fill": lambda t: t.masked_fill(t > 0, 0.0), "masked_select": lambda t: t.masked_select(t > 0),
        "max_pool2d": lambda t: F.max_pool2d(t, 2), "mse_loss": lambda t: F.mse_loss(t, t.detach()),
        "nll_loss": lambda t: F.nll_loss(t.flatten(0, 2), i64(60)), "norm": lambda t: t.norm(dim=-1),
        "one_hot": lambda t: F.one_hot(i64(3, 4), 5), "pad": lambda t: F.pad(t, (1, 1)),
        "prod": lambda t: t.prod(-1), "repeat": lambda t: t.repeat(1, 1, 1, 2),
        "roll": lambda t: t.roll(1, -1), "smooth_l1_loss": lambda t: F.smooth_l1_loss(t, t.detach()),
        "softmax": lambda t: t.softmax(-1), "stack": lambda t: torch.stack([t, t]),
        "std": lambda t: t.std(-1), "tril": lambda t: t.tril(), "triu": lambda t: t.triu(),
        "var": lambda t: t.var(-1),
    }


def disagreements(torch, name, storage, layout, autograd, f):
    base = torch.randn(3, 5, 4, 6).requires_grad_(layout != "Permuted")
    x = base.transpose(1, 2) if layout in ("Contiguous", "Same") else base.detach().requires_grad_()
    out = f(x)
    shares = out.storage().data_ptr() == x.storage().data_ptr()
    problems = []
    if storage == "View" and not shares:
        problems.append("View, but the result has its own storage")
    if storage == "MayAlias" and not shares:
        problems.append("MayAlias, but it copied where it could return self")
    if storage == "Fresh" and shares:
        problems.append("Fresh, but the result shares self's storage")
    if layout == "Contiguous" and not out.is_contiguous():
        problems.append("Contiguous, but the result of a transposed input is not")
    if layout == "Same" and out.shape == x.shape and out.stride() != x.stride():
        problems.append("Same, but the result's strides %s differ from self's %s" % (out.stride(), x.stride()))
    if layout == "Permuted" and out.is_contiguous():
        problems.append("Permuted, but the result of a contiguous input is contiguous")
    recorded = out.grad_fn is not None
    if out.is_floating_point() and recorded != (autograd == "Differentiable"):
        problems.append("%s, but autograd %s it" % (autograd, "records" if recorded else "does not record"))
    return problems


def main():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("check_op_table: PyTorch is missing (install python3-torch)", file=sys.stderr)
        return 2
    rows = ROW.findall((ROOT / "runtime/include/tt/ops.def").read_text())
    table = probes(torch, F)
    failed = 0
    for name, storage, layout, autograd in rows:
        if name not in table:
            print("%s: no probe in scripts/check_op_table.py" % name)
            failed += 1
            continue
        try:
            found = disagreements(torch, name, storage, layout, autograd, table[name])
        except RuntimeError as e:
            found = ["a probe that PyTorch rejects: %s" % str(e).splitlines()[0]]
        for p in found:
            print("%s: ops.def says %s" % (name, p))
            failed += 1
    print("%d LibTorch rows checked against PyTorch %s, %d disagreements" % (len(rows), torch.__version__, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
