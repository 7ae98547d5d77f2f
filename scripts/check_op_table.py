#!/usr/bin/env python3
"""Checks every TT_LIBTORCH_OP row of runtime/include/tt/ops.def against
PyTorch (run with /usr/bin/python3, Debian's python3-torch): storage (view /
fresh / may-alias), result layout (contiguous / same as self / permuted) and
whether autograd records the op; and every TT_SAVES row (what an op saves for
backward), plus the probed ops that are not listed (they must save nothing),
by modifying the result or an input in place and running backward; and the
TT_RESHAPES_SELF rows (in-place ops that change self's layout; other in-place
ops must keep it); the TT_RESULT_DTYPE, TT_VALUES_INDICES, TT_WHOLE_RESULT and
TT_KEEPS_WHOLE rows (result dtypes, whole-number results); the TT_MODULE rows (torch.nn
modules: weights, what backward saves, output sizes and layout). Exit 0 all agree, 1 a row disagrees or has
no probe, 2 PyTorch is missing."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROW = re.compile(r"^TT_LIBTORCH_OP\((\w+),\s*(\w+),\s*(\w+),\s*(\w+)\)", re.M)
SAVES_ROW = re.compile(r"^TT_SAVES\((\w+),\s*(\w+)\)", re.M)
RESHAPES_ROW = re.compile(r"^TT_RESHAPES_SELF\((\w+)\)", re.M)
DTYPE_ROW = re.compile(r"^TT_RESULT_DTYPE\((\w+),\s*(\w+)\)", re.M)
VALUES_INDICES_ROW = re.compile(r"^TT_VALUES_INDICES\((\w+)\)", re.M)
WHOLE_ROW = re.compile(r"^TT_WHOLE_RESULT\((\w+)\)", re.M)
KEEPS_WHOLE_ROW = re.compile(r"^TT_KEEPS_WHOLE\((\w+)\)", re.M)
PROMOTES_ROW = re.compile(r"^TT_SCALAR_PROMOTES\((\w+)\)", re.M)
MODULE_ROW = re.compile(r"^TT_MODULE\((\w+),\s*(\w+),\s*(\w+),\s*(\w+),\s*(\w+),\s*(\d)\)", re.M)


def probes(torch, F):
    """name -> f(x), x a float [3, 4, 5, 6] tensor (transposed from [3, 5, 4, 6]
    for the Contiguous and Same rows, contiguous for the views)."""
    i64 = lambda *s: torch.zeros(*s, dtype=torch.long)
    return {
        "eye": lambda t: torch.eye(3), "randint": lambda t: torch.randint(0, 4, (3, 4)),
        "randperm": lambda t: torch.randperm(5),
        "rand_like": torch.rand_like, "randn_like": torch.randn_like,
        "randint_like": lambda t: torch.randint_like(t, 4),
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
        "cos": torch.cos, "acos": torch.acos, "asin": torch.asin, "atanh": torch.atanh,
        "digamma": torch.digamma, "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
        "dropout": lambda t: F.dropout(t, 0.5, True), "elu": F.elu, "erf": torch.erf,
        "expm1": torch.expm1, "flip": lambda t: t.flip(-1), "floor": torch.floor,
        "fmod": lambda t: t.fmod(2), "gelu": F.gelu, "hardsigmoid": F.hardsigmoid,
        "hardswish": F.hardswish, "hardtanh": F.hardtanh, "isinf": torch.isinf, "isnan": torch.isnan,
        "leaky_relu": F.leaky_relu, "lerp": lambda t: t.lerp(t * 2, 0.5), "log1p": lambda t: t.abs().log1p(),
        "log10": lambda t: t.abs().log10(), "log2": lambda t: t.abs().log2(),
        "logit": lambda t: t.sigmoid().logit(), "sinh": torch.sinh, "cosh": torch.cosh,
        "tan": torch.tan, "atan": torch.atan, "exp2": torch.exp2,
        "logical_and": lambda t: torch.logical_and(t, t), "logical_not": torch.logical_not,
        "logical_or": lambda t: torch.logical_or(t, t), "logical_xor": lambda t: torch.logical_xor(t, t),
        "logaddexp": lambda t: torch.logaddexp(t, t), "logaddexp2": lambda t: torch.logaddexp2(t, t),
        "atan2": lambda t: torch.atan2(t, t), "fmax": lambda t: torch.fmax(t, t),
        "fmin": lambda t: torch.fmin(t, t), "xlogy": lambda t: torch.xlogy(t.abs(), t.abs()),
        "bernoulli": lambda t: torch.bernoulli(t.sigmoid()),
        "multinomial": lambda t: torch.multinomial(t.flatten(0, 2).softmax(-1), 2),
        "bincount": lambda t: torch.bincount((t.abs() * 3).long().flatten()),
        "bitwise_and": lambda t: (t > 0) & (t < 1), "bitwise_not": lambda t: ~(t > 0),
        "bitwise_or": lambda t: (t > 0) | (t < 1), "bitwise_xor": lambda t: (t > 0) ^ (t < 1),
        "bitwise_left_shift": lambda t: t.long() << 1, "bitwise_right_shift": lambda t: t.long() >> 1,
        "maximum": lambda t: torch.maximum(t, t), "minimum": lambda t: torch.minimum(t, t),
        # (values, indices) ops: their values
        "sort": lambda t: t.sort(1)[0], "topk": lambda t: t.topk(2, 1)[0],
        "kthvalue": lambda t: t.kthvalue(2, 1)[0], "median": lambda t: t.median(1)[0],
        "mode": lambda t: t.mode(1)[0], "cummax": lambda t: t.cummax(1)[0],
        "cummin": lambda t: t.cummin(1)[0],
        "mish": F.mish, "nan_to_num": torch.nan_to_num, "normalize": lambda t: F.normalize(t, dim=-1),
        "reciprocal": torch.reciprocal, "relu6": F.relu6, "remainder": lambda t: t.remainder(2),
        "round": torch.round, "trunc": torch.trunc,
        "scatter": lambda t: t.scatter(-1, i64(*t.shape[:-1], 1), -2.0), "rsqrt": lambda t: t.abs().rsqrt(), "selu": F.selu, "sign": torch.sign,
        "silu": F.silu, "sin": torch.sin, "softplus": F.softplus, "softsign": F.softsign,
        "square": torch.square,
        "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, 1), "amax": lambda t: t.amax(-1),
        "addmm": lambda t: torch.addmm(t[0, 0, 0, :5], t[0, 0], t[0, 1].t()),
        "baddbmm": lambda t: torch.baddbmm(t[0][..., :5], t[0], t[0].transpose(1, 2)),
        "grid_sample": lambda t: F.grid_sample(t, torch.zeros(3, 2, 2, 2), align_corners=False),
        "outer": lambda t: torch.outer(t[0, 0, 0], t[0, 1, 0]),
        "amin": lambda t: t.amin(-1), "mean_dim": lambda t: t.mean(-1), "avg_pool2d": lambda t: F.avg_pool2d(t, 2),
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


def saves_probes(torch, F):
    """name -> (f(a, b), shape of a, shape of b or None); a is the op's self."""
    sq = (4, 6)
    un = lambda f: (lambda a, b: f(a), sq, None)
    bi = lambda f, sb=sq: (f, sq, sb)
    return {
        "abs": un(torch.abs), "clamp": un(lambda a: a.clamp(-0.5, 0.5)), "exp": un(torch.exp),
        "log": un(torch.log), "pow": un(lambda a: a.pow(2)), "relu": un(torch.relu),
        "sigmoid": un(torch.sigmoid), "sqrt": un(torch.sqrt), "tanh": un(torch.tanh),
        "mul": bi(torch.mul), "div": bi(torch.div), "mm": bi(torch.mm, (6, 3)),
        "matmul": bi(torch.matmul, (6, 3)), "bmm": (torch.bmm, (2, 4, 6), (2, 6, 3)),
        "batch_norm": un(lambda a: F.batch_norm(a, None, None, training=True)),
        "binary_cross_entropy": bi(lambda a, b: F.binary_cross_entropy(a, b)),
        "binary_cross_entropy_with_logits": bi(F.binary_cross_entropy_with_logits),
        "conv1d": (F.conv1d, (2, 3, 5), (4, 3, 3)), "conv2d": (F.conv2d, (2, 3, 5, 5), (4, 3, 3, 3)),
        "cos": un(torch.cos), "acos": un(torch.acos), "asin": un(torch.asin),
        "atanh": un(torch.atanh), "digamma": un(torch.digamma), "erfc": un(torch.erfc),
        "erfinv": un(torch.erfinv), "lgamma": un(torch.lgamma), "elu": un(F.elu), "erf": un(torch.erf), "gelu": un(F.gelu),
        "hardtanh": un(F.hardtanh), "l1_loss": bi(F.l1_loss), "layer_norm": un(lambda a: F.layer_norm(a, [6])),
        "leaky_relu": un(F.leaky_relu), "linear": bi(F.linear, (3, 6)), "log1p": un(torch.log1p),
        "log10": un(torch.log10), "log2": un(torch.log2), "logit": un(torch.logit),
        "sinh": un(torch.sinh), "cosh": un(torch.cosh), "tan": un(torch.tan),
        "atan": un(torch.atan), "exp2": un(torch.exp2), "atan2": bi(torch.atan2),
        "fmax": bi(torch.fmax), "fmin": bi(torch.fmin), "logaddexp": bi(torch.logaddexp),
        "logaddexp2": bi(torch.logaddexp2), "xlogy": bi(torch.xlogy),
        "log_sigmoid": un(F.logsigmoid), "log_softmax": un(lambda a: a.log_softmax(-1)),
        "logsumexp": un(lambda a: a.logsumexp(-1)), "mse_loss": bi(F.mse_loss),
        "norm": un(lambda a: a.norm(2, -1, True)),
        "prod": un(lambda a: a.prod(-1)), "reciprocal": un(torch.reciprocal), "relu6": un(F.relu6),
        "rsqrt": un(torch.rsqrt), "silu": un(F.silu), "sin": un(torch.sin),
        "smooth_l1_loss": bi(F.smooth_l1_loss), "softmax": un(lambda a: a.softmax(-1)),
        "softplus": un(F.softplus), "square": un(torch.square),
        # save nothing an in-place write can reach
        "add": bi(torch.add), "sub": bi(torch.sub), "sum": un(torch.sum), "mean": un(torch.mean),
        "mean_dim": un(lambda a: a.mean(-1, True)),
        "neg": un(torch.neg), "clone": un(torch.clone), "cat": bi(lambda a, b: torch.cat([a, b])),
        "stack": bi(lambda a, b: torch.stack([a, b])), "dropout": un(lambda a: F.dropout(a, 0.5, True)),
        "cross_entropy": un(lambda a: F.cross_entropy(a, torch.zeros(4, dtype=torch.long))),
    }


def expected_saves(saves, other_requires_grad):
    """(result, self, other) saved, for a row's Saves value."""
    return {
        "Result": (True, False, False), "Self": (False, True, False),
        "SelfResult": (True, True, False), "Inputs": (False, True, True),
        "Cross": (False, other_requires_grad, True), "Divisor": (False, other_requires_grad, True),
        "Nothing": (False, False, False),
    }[saves]


def raises_after_write(torch, probe, which, other_requires_grad):
    """Does backward raise PyTorch's error after an in-place write to which
    ('result', 'self', 'other') following the op?"""
    f, sa, sb = probe
    a = (torch.rand(*sa) * 0.5 + 0.25).requires_grad_() * 1  # in (0, 1): log, bce
    b = None
    if sb is not None:
        b = torch.rand(*sb) * 0.5 + 0.25
        b = b.requires_grad_() * 1 if other_requires_grad else b
    out = f(a, b)
    target = {"result": out, "self": a, "other": b}[which]
    with torch.no_grad():
        target.mul_(1)  # bumps the version counter, keeps the values
    try:
        out.sum().backward()
    except RuntimeError as e:
        if "modified by an inplace operation" in str(e):
            return True
        raise
    return False


def saves_disagreements(torch, F):
    listed = dict(SAVES_ROW.findall((ROOT / "runtime/include/tt/ops.def").read_text()))
    probes = saves_probes(torch, F)
    problems = ["%s: TT_SAVES row without a probe" % n for n in listed if n not in probes]
    for name, probe in sorted(probes.items()):
        saves = listed.get(name, "Nothing")
        for other_rg in (False, True) if probe[2] is not None else (False,):
            want = expected_saves(saves, other_rg)
            for which, w in zip(("result", "self", "other"), want):
                if which == "other" and probe[2] is None:
                    continue
                got = raises_after_write(torch, probe, which, other_rg)
                if got != w:
                    problems.append("%s: ops.def says %s, but a write to its %s%s %s backward" % (
                        name, saves, which, " (other requires grad)" if other_rg else "",
                        "breaks" if got else "does not break"))
    return problems, len(probes)


def inplace_saves_disagreements(torch):
    """op_semantics.h's savesOfInPlace: `name_` saves its result exactly when
    the TT_SAVES row of `name` saves its result. Probed on every row whose
    in-place form takes no argument (exp_, relu_, log_...)."""
    listed = dict(SAVES_ROW.findall((ROOT / "runtime/include/tt/ops.def").read_text()))
    problems, probed = [], 0
    for name, saves in sorted(listed.items()):
        a = (torch.rand(4, 6) * 0.5 + 0.25).requires_grad_() * 1
        method = getattr(a, name + "_", None)
        if method is None:
            continue
        try:
            out = method()
        except (TypeError, RuntimeError):
            continue  # needs arguments (clamp_, pow_): not derived here
        with torch.no_grad():
            out.mul_(1)
        try:
            out.sum().backward()
            breaks = False
        except NotImplementedError:
            continue  # no derivative for the in-place form (atanh_ in 1.13)
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                raise
            breaks = True
        probed += 1
        if breaks != (saves in ("Result", "SelfResult")):
            problems.append("%s_: a write to its result %s backward, but savesOfInPlace says %s" % (
                name, "breaks" if breaks else "does not break",
                "it saves it" if not breaks else "it saves nothing"))
    return problems, probed


def reshapes_probes(torch):
    """name -> f(x) for in-place ops: the TT_RESHAPES_SELF rows and, on a
    transposed [4, 5] float tensor, in-place ops outside that list, which must
    keep self's sizes, strides, dtype and device. A (make, f) pair probes
    its own tensor."""
    idx, idx2 = torch.tensor([0, 2]), torch.zeros(4, 5, dtype=torch.long)
    mask = torch.rand(4, 5) > 0.5
    return {
        "as_strided_": lambda x: x.as_strided_((2, 2), (1, 2)),
        "resize_": lambda x: x.resize_(2, 10),
        "resize_as_": lambda x: x.resize_as_(torch.empty(20)),
        "set_": lambda x: x.set_(torch.empty(7)),
        "squeeze_": (lambda: torch.randn(5, 1, 4).transpose(0, 2), lambda x: x.squeeze_()),
        "swapaxes_": lambda x: x.swapaxes_(0, 1),
        "swapdims_": lambda x: x.swapdims_(0, 1),
        "t_": lambda x: x.t_(),
        "transpose_": lambda x: x.transpose_(0, 1),
        "unsqueeze_": lambda x: x.unsqueeze_(0),
        "index_add_": lambda x: x.index_add_(0, idx, torch.ones(2, 5)),
        "index_copy_": lambda x: x.index_copy_(0, idx, torch.ones(2, 5)),
        "index_fill_": lambda x: x.index_fill_(0, idx, 1.0),
        "masked_fill_": lambda x: x.masked_fill_(mask, 0.0),
        "masked_scatter_": lambda x: x.masked_scatter_(mask, torch.ones(20)),
        "scatter_": lambda x: x.scatter_(0, idx2, torch.ones(4, 5)),
        "scatter_add_": lambda x: x.scatter_add_(0, idx2, torch.ones(4, 5)),
        "put_": lambda x: x.put_(idx, torch.ones(2)),
        "clamp_min_": lambda x: x.clamp_min_(0.0),
        "addcmul_": lambda x: x.addcmul_(torch.ones(4, 5), torch.ones(4, 5)),
        "lerp_": lambda x: x.lerp_(torch.ones(4, 5), 0.5),
        "normal_": lambda x: x.normal_(),
        "uniform_": lambda x: x.uniform_(),
        "bernoulli_": lambda x: x.bernoulli_(0.5),
        "floor_": lambda x: x.floor_(),
        "sign_": lambda x: x.sign_(),
        "fill_": lambda x: x.fill_(1.0),
        "add_": lambda x: x.add_(torch.ones(5)),
        "copy_": lambda x: x.copy_(torch.ones(4, 5, dtype=torch.float64)),
        "requires_grad_": lambda x: x.requires_grad_(),
    }


def reshapes_disagreements(torch):
    listed = set(RESHAPES_ROW.findall((ROOT / "runtime/include/tt/ops.def").read_text()))
    probes = reshapes_probes(torch)
    problems = ["%s: TT_RESHAPES_SELF row without a probe" % n for n in listed if n not in probes]
    for name, f in sorted(probes.items()):
        make, f = f if isinstance(f, tuple) else (lambda: torch.randn(5, 4).t(), f)
        x = make()
        before = (x.size(), x.stride(), x.dtype, x.device)
        f(x)
        kept = before == (x.size(), x.stride(), x.dtype, x.device)
        if kept == (name in listed):
            problems.append("%s: ops.def says it %s self's layout, but PyTorch %s it" % (
                name, "changes" if name in listed else "keeps", "keeps" if kept else "changes"))
    return problems, len(probes)


def dtype_probes(torch, F):
    """name -> f(x) for the TT_RESULT_DTYPE rows, x a [4, 5] tensor of small
    non-negative whole numbers, float64 or int64."""
    return {
        "argmax": lambda x: x.argmax(1), "argmin": lambda x: x.argmin(1),
        "argsort": lambda x: x.argsort(1), "nonzero": lambda x: x.nonzero(),
        "multinomial": lambda x: torch.multinomial(x.abs() + 0.1, 2),
        "bincount": lambda x: x.long().flatten().bincount(),
        "one_hot": lambda x: F.one_hot(x.long(), 6),
        "eq": lambda x: x.eq(x), "ge": lambda x: x.ge(x), "gt": lambda x: x.gt(x),
        "le": lambda x: x.le(x), "lt": lambda x: x.lt(x), "ne": lambda x: x.ne(x),
        "isinf": lambda x: x.isinf(), "isnan": lambda x: x.isnan(),
        "logical_and": lambda x: x.logical_and(x), "logical_not": lambda x: x.logical_not(),
        "logical_or": lambda x: x.logical_or(x), "logical_xor": lambda x: x.logical_xor(x),
        "atan2": lambda x: x.atan2(x + 1), "xlogy": lambda x: x.xlogy(x + 1),
        "div": lambda x: x / (x + 1), "erf": lambda x: x.erf(), "erfc": lambda x: x.erfc(),
        "erfinv": lambda x: x.erfinv(), "lgamma": lambda x: x.lgamma(), "digamma": lambda x: x.digamma(),
        "asin": lambda x: x.asin(), "acos": lambda x: x.acos(), "atanh": lambda x: x.atanh(), "exp": lambda x: x.exp(),
        "expm1": lambda x: x.expm1(), "gelu": lambda x: F.gelu(x), "log": lambda x: x.log(),
        "interpolate": lambda x: F.interpolate(x.reshape(1, 1, 4, 5), size=(2, 3)),
        "log1p": lambda x: x.log1p(), "log10": lambda x: x.log10(), "log2": lambda x: x.log2(),
        "logit": lambda x: x.logit(), "sinh": lambda x: x.sinh(), "cosh": lambda x: x.cosh(),
        "tan": lambda x: x.tan(), "atan": lambda x: x.atan(), "exp2": lambda x: x.exp2(), "log_softmax": lambda x: x.log_softmax(1),
        "mean": lambda x: x.mean(), "mean_dim": lambda x: x.mean(1), "rsqrt": lambda x: x.rsqrt(), "sigmoid": lambda x: x.sigmoid(),
        "silu": lambda x: F.silu(x), "softmax": lambda x: x.softmax(1), "sqrt": lambda x: x.sqrt(),
        "tanh": lambda x: x.tanh(),
        "gather": lambda x: x.gather(1, torch.zeros(4, 2, dtype=torch.long)),
        "index_select": lambda x: x.index_select(1, torch.tensor([0, 2])),
        "masked_fill": lambda x: x.masked_fill(x > 1, torch.tensor(2.5)),
        "masked_select": lambda x: x.masked_select(x > 1),
        "where": lambda x: torch.where(x > 1, x, x + 1),
    }


def dtype_disagreement(torch, rule, f):
    """Bool / Long: that dtype from a float64 input; Floating: float64 from
    float64, and float32 from int64 where the op takes integers; Own and
    Values: float64 and int64 from those, whatever the index, mask, fill or
    condition operands."""
    x = torch.randint(0, 4, (4, 5))
    got = f(x.double()).dtype
    if rule in ("Own", "Values"):
        from_int = f(x).dtype
        if (got, from_int) == (torch.float64, torch.long):
            return None
        return "gives %s from float64 and %s from int64" % (got, from_int)
    if rule in ("Bool", "Long"):
        want = torch.bool if rule == "Bool" else torch.long
        return None if got == want else "gives %s" % got
    try:
        from_int = f(x).dtype
    except RuntimeError:
        from_int = torch.float32  # integers rejected: nothing to disagree with
    if got == torch.float64 and from_int == torch.float32:
        return None
    return "gives %s from float64 and %s from int64" % (got, from_int)


def values_indices_probes(torch):
    return {
        "cummax": lambda x: x.cummax(1), "cummin": lambda x: x.cummin(1),
        "kthvalue": lambda x: x.kthvalue(2, 1), "max": lambda x: x.max(1),
        "median": lambda x: x.median(1), "min": lambda x: x.min(1), "mode": lambda x: x.mode(1),
        "sort": lambda x: x.sort(1), "topk": lambda x: x.topk(2, 1),
    }


def result_dtype_disagreements(torch, F):
    """TT_RESULT_DTYPE rows by their rule; TT_VALUES_INDICES rows: a pair of
    values in self's dtype (float64 here) and int64 indices."""
    text = (ROOT / "runtime/include/tt/ops.def").read_text()
    problems, probes = [], dtype_probes(torch, F)
    rows = DTYPE_ROW.findall(text)
    for name, rule in rows:
        found = dtype_disagreement(torch, rule, probes[name]) if name in probes else "no probe"
        if found:
            problems.append("%s: ops.def says %s, but PyTorch %s" % (name, rule, found))
    pairs, vi = VALUES_INDICES_ROW.findall(text), values_indices_probes(torch)
    for name in pairs:
        if name not in vi:
            problems.append("%s: TT_VALUES_INDICES row without a probe" % name)
            continue
        got = vi[name](torch.randn(4, 5, dtype=torch.float64))
        if len(got) != 2 or (got[0].dtype, got[1].dtype) != (torch.float64, torch.long):
            problems.append("%s: ops.def says (values, indices), but PyTorch gives %s" % (
                name, [t.dtype for t in got]))
    whole_problems, wholes = whole_number_disagreements(torch, text)
    promote_problems, promotes = scalar_promotion_disagreements(torch, text)
    return problems + whole_problems + promote_problems, len(rows) + len(pairs) + wholes + promotes


def scalar_promotion_disagreements(torch, text):
    """TT_SCALAR_PROMOTES rows: a floating scalar makes an int64 or int32 self's
    result float32 and keeps a float64 self's dtype."""
    probes = {"clamp": lambda x, s: x.clamp(0, s), "rsub": lambda x, s: torch.rsub(x, s)}
    problems = []
    rows = PROMOTES_ROW.findall(text)
    for name in rows:
        f = probes.get(name, lambda x, s, n=name: getattr(x, n)(s))
        x = torch.arange(1, 7).reshape(2, 3)
        got = [f(x, 2.5).dtype, f(x.int(), 2.5).dtype, f(x.double(), 2.5).dtype]
        if got != [torch.float32, torch.float32, torch.float64]:
            problems.append("%s: ops.def says a floating scalar promotes, but PyTorch gives %s"
                            % (name, got))
    return problems, len(rows)


def whole_number_disagreements(torch, text):
    """TT_WHOLE_RESULT rows give whole numbers from any input; TT_KEEPS_WHOLE
    rows keep whole numbers whole (with whole-number bounds), and are not
    trivially so: a fraction in gives a fraction out."""
    keep_probes = {"clamp": lambda x: x.clamp(-50, 50), "clamp_max": lambda x: x.clamp_max(10),
                   "clamp_min": lambda x: x.clamp_min(-10)}
    problems, checked = [], 0
    for rows, whole_in in ((WHOLE_ROW.findall(text), False), (KEEPS_WHOLE_ROW.findall(text), True)):
        for name in rows:
            f = keep_probes.get(name, lambda x, n=name: getattr(torch, n)(x))
            x = torch.randn(64, dtype=torch.float64) * 100
            got = f(x.round() if whole_in else x)
            if got.dtype != x.dtype or not torch.equal(got, got.trunc()):
                problems.append("%s: ops.def says whole numbers, but PyTorch gives %s" % (name, got[:3]))
            elif whole_in and torch.equal(f(x + 0.25), f(x + 0.25).trunc()):
                problems.append("%s: keeps whole numbers only trivially (no fraction survives)" % name)
            checked += 1
    return problems, checked


def module_probes(nn):
    """name -> (module, sizes of the float tensor module_call derives its
    input from: indices, several inputs, tuples)."""
    return {
        "Linear": (nn.Linear(6, 3), (4, 5, 6)), "Bilinear": (nn.Bilinear(6, 6, 3), (4, 6)),
        "Conv1d": (nn.Conv1d(4, 3, 3), (2, 4, 7)), "Conv2d": (nn.Conv2d(4, 3, 3), (2, 4, 7, 7)),
        "Conv3d": (nn.Conv3d(4, 3, 3), (2, 4, 5, 5, 5)),
        "ConvTranspose1d": (nn.ConvTranspose1d(4, 3, 3), (2, 4, 7)),
        "ConvTranspose2d": (nn.ConvTranspose2d(4, 3, 3), (2, 4, 7, 7)),
        "ConvTranspose3d": (nn.ConvTranspose3d(4, 3, 3), (2, 4, 5, 5, 5)),
        "Embedding": (nn.Embedding(10, 4), (4, 6)), "EmbeddingBag": (nn.EmbeddingBag(10, 4), (4, 6)),
        "LSTM": (nn.LSTM(6, 3), (5, 2, 6)), "GRU": (nn.GRU(6, 3), (5, 2, 6)),
        "RNN": (nn.RNN(6, 3), (5, 2, 6)),
        "LSTMCell": (nn.LSTMCell(6, 3), (5, 6)), "GRUCell": (nn.GRUCell(6, 3), (5, 6)),
        "RNNCell": (nn.RNNCell(6, 3), (5, 6)), "MultiheadAttention": (nn.MultiheadAttention(6, 2), (5, 2, 6)),
        "LayerNorm": (nn.LayerNorm(6), (4, 5, 6)), "GroupNorm": (nn.GroupNorm(2, 4), (2, 4, 5, 6)),
        "BatchNorm1d": (nn.BatchNorm1d(4), (3, 4, 5)), "BatchNorm2d": (nn.BatchNorm2d(4), (2, 4, 5, 6)),
        "BatchNorm3d": (nn.BatchNorm3d(4), (2, 4, 3, 5, 6)),
        "InstanceNorm1d": (nn.InstanceNorm1d(4), (3, 4, 5)),
        "InstanceNorm2d": (nn.InstanceNorm2d(4), (2, 4, 5, 6)),
        "InstanceNorm3d": (nn.InstanceNorm3d(4), (2, 4, 3, 5, 6)),
        "LocalResponseNorm": (nn.LocalResponseNorm(2), (2, 4, 5, 6)), "PReLU": (nn.PReLU(), (4, 5, 6)),
        "MaxPool1d": (nn.MaxPool1d(2), (2, 4, 8)), "MaxPool2d": (nn.MaxPool2d(2), (2, 4, 8, 8)),
        "MaxPool3d": (nn.MaxPool3d(2), (2, 4, 4, 4, 4)), "AvgPool1d": (nn.AvgPool1d(2), (2, 4, 8)),
        "AvgPool2d": (nn.AvgPool2d(2), (2, 4, 8, 8)), "AvgPool3d": (nn.AvgPool3d(2), (2, 4, 4, 4, 4)),
        "Softmax": (nn.Softmax(dim=-1), (4, 5, 6)), "LogSoftmax": (nn.LogSoftmax(dim=-1), (4, 5, 6)),
        "Softmin": (nn.Softmin(dim=-1), (4, 5, 6)),
    }


def module_call(torch, name, m, x):
    """The module's output on float input x (for modules taking indices or
    several inputs, an input derived from x); the first of a tuple."""
    if name in ("Embedding", "EmbeddingBag"):
        return m((x.detach().abs() * 3).long().clamp(0, 9))
    if name == "Bilinear":
        return m(x, x * 1)
    if name == "MultiheadAttention":
        return m(x, x, x)[0]
    out = m(x)
    return out[0] if isinstance(out, tuple) else out


def layouts(torch, sizes):
    """Inputs of the given sizes: contiguous, a transpose of the last two
    dims, and channels-last for 4-D and 5-D (a permuted NHWC tensor)."""
    x = torch.rand(*sizes)
    out = [("contiguous", x), ("transposed", x.transpose(-1, -2).contiguous().transpose(-1, -2))]
    if len(sizes) in (4, 5):
        perm = (0,) + tuple(range(2, len(sizes))) + (1,)
        back = (0, len(sizes) - 1) + tuple(range(1, len(sizes) - 1))
        out.append(("channels-last", x.permute(*perm).contiguous().permute(*back)))
    return out


def module_shape_ok(shape, dims, x, y, m):
    if shape == "Embedding":
        return y.shape == x.shape + (m.embedding_dim,)
        return y.shape == x.shape
    if shape == "Linear":
        return y.shape == x.shape[:-1] + (m.out_features,)
    if shape in ("Conv", "Pool"):
        kept = 1 + (shape == "Pool")
        return x.dim() == dims + 2 and y.dim() == x.dim() and y.shape[:kept] == x.shape[:kept]
    return True


def module_saves(torch, name, m, sizes):
    """'Input', 'Result' or 'Nothing': which in-place write (to the input, to
    the output) makes backward raise, the weights requiring grad."""
    got = []
    for which in ("input", "result"):
        x = (torch.rand(*sizes) + 0.5).requires_grad_() * 1
        y = module_call(torch, name, m, x)
        with torch.no_grad():
            (x if which == "input" else y).mul_(1)
        try:
            y.sum().backward()
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                raise
            got.append(which)
    return {(): "Nothing", ("input",): "Input", ("result",): "Result",
            ("input", "result"): "InputResult"}.get(tuple(got), "/".join(got))


def module_disagreements(torch, text):
    """Every TT_MODULE row against torch.nn: parameters, what backward saves,
    the output's sizes and (Contiguous rows) its layout on every input layout."""
    probes = module_probes(torch.nn)
    problems = []
    rows = MODULE_ROW.findall(text)
    for name, weights, saves, shape, layout, dims in rows:
        if name not in probes and not hasattr(torch.nn, name):
            problems.append("%s: no torch.nn module of that name" % name)
            continue
        m, sizes = probes[name] if name in probes else (getattr(torch.nn, name)(), (4, 5, 6))
        if (weights == "Weights") != bool(list(m.parameters())):
            problems.append("%s: ops.def says %s" % (name, weights))
        got = module_saves(torch, name, m, sizes)
        if got != saves:
            problems.append("%s: ops.def says it saves %s, PyTorch: %s" % (name, saves, got))
        for kind, x in layouts(torch, sizes):
            y = module_call(torch, name, m, x)
            if not module_shape_ok(shape, int(dims), x, y, m):
                problems.append("%s: ops.def says shape %s, got %s from %s" % (name, shape, tuple(y.shape), tuple(x.shape)))
            must = layout == "Contiguous" or (layout == "AsInput" and kind == "contiguous")
            if must and not y.is_contiguous():
                problems.append("%s: ops.def says %s, but a %s input gives a non-contiguous output" % (name, layout, kind))
    return problems, len(rows)


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
    saves_problems, probed = saves_disagreements(torch, F)
    for p in saves_problems:
        print(p)
    print("%d ops' saved tensors checked against PyTorch, %d disagreements" % (probed, len(saves_problems)))
    inplace_problems, probed = inplace_saves_disagreements(torch)
    for p in inplace_problems:
        print(p)
    print("%d in-place ops' saved results checked against PyTorch, %d disagreements" % (probed, len(inplace_problems)))
    saves_problems += inplace_problems
    reshape_problems, probed = reshapes_disagreements(torch)
    for p in reshape_problems:
        print(p)
    print("%d in-place ops' layouts checked against PyTorch, %d disagreements" % (probed, len(reshape_problems)))
    dtype_problems, probed = result_dtype_disagreements(torch, F)
    for p in dtype_problems:
        print(p)
    print("%d result-dtype rows checked against PyTorch, %d disagreements" % (probed, len(dtype_problems)))
    module_problems, probed = module_disagreements(torch, (ROOT / "runtime/include/tt/ops.def").read_text())
    for p in module_problems:
        print(p)
    print("%d torch.nn module rows checked against PyTorch, %d disagreements" % (probed, len(module_problems)))
    return 1 if failed or saves_problems or reshape_problems or dtype_problems or module_problems else 0


if __name__ == "__main__":
    sys.exit(main())
