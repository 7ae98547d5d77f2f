#!/usr/bin/python3
"""Generate the PyTorch conformance golden file for the tt runtime.

Runs with Debian's python3-torch (1.13), the oracle:

    /usr/bin/python3 scripts/gen_conformance.py [-o test/conformance/golden.json]

For every row of runtime/include/tt/ops.def it replays the cases below in
PyTorch and records what happened: whether each result shares storage with the
op's input (storage data_ptr equality), whether it is the input itself, its
sizes/strides/storage offset/contiguity/dtype/requires_grad, a few values,
whether the input's version counter was bumped, whether the result shares the
input's version counter (views, detach), and the error message, if any.
test/unit/conformance/ConformanceTest.cpp replays the same cases with tt.

A case is a tiny program over named tensors, interpreted the same way here and
in the C++ test:
  tensors  name -> {sizes, dtype, values (row-major), requires_grad}
  steps    [{out, op, self, args, kwargs}], self/out are tensor names or null
           (an op returning several tensors names them out[0], out[1], ...);
           args: numbers, int lists, {"tensor": name}, {"dtype": name},
           {"device": name}, {"slice": [start, stop, step]} (nulls allowed)
  measure  index of the step whose op is the row under test
  expect   what PyTorch did (see run_case()), including the outputs of the
           steps after the op ("post": losses, gradients)
Errors are matched by a key phrase, chosen below and checked to be part of
PyTorch's message: the runtime must throw in PyTorch's words.

A row of ops.def without a case here, or a case that stops behaving as written
(an expected error that does not happen, or vice versa), fails generation.
The output is byte-for-byte reproducible (test/conformance/regenerate.test).
"""

import argparse
import json
import math
import pathlib
import re
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPS_DEF = ROOT / "runtime" / "include" / "tt" / "ops.def"
DEFAULT_OUT = ROOT / "test" / "conformance" / "golden.json"
MAX_VALUES = 8

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
    "int64": torch.int64, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def parse_ops_def(path):
    """Rows of ops.def in order: (name, storage, layout, autograd)."""
    rows = []
    row_re = re.compile(r"^TT_OP\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)")
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("//", 1)[0].strip()
        if not code.startswith("TT_OP("):
            if "TT_OP(" in code and not code.startswith("#"):
                sys.exit(f"{path}:{lineno}: cannot parse: {line}")
            continue
        m = row_re.match(code)
        if not m:
            sys.exit(f"{path}:{lineno}: cannot parse row: {line}")
        rows.append(m.groups())
    if not rows:
        sys.exit(f"{path}: no TT_OP rows found")
    return rows


# --- inputs -------------------------------------------------------------------

def fill(n, dtype, signed):
    """Distinct, non-monotonic, exactly representable values."""
    mul = next(k for k in (7, 11, 13, 17, 19, 23, 29) if math.gcd(k, n) == 1)
    ks = [(i * mul) % n + 1 for i in range(n)]
    if dtype == "bool":
        return [k % 2 == 0 for k in ks]
    if dtype in ("int32", "int64"):
        return [k - (n // 2 if signed else 0) for k in ks]
    return [(k - (n // 2 if signed else 0)) * 0.125 for k in ks]


def leaf(sizes, dtype="float32", signed=False, requires_grad=False):
    n = math.prod(sizes)
    return {"sizes": list(sizes), "dtype": dtype, "values": fill(n, dtype, signed),
            "requires_grad": requires_grad}


def step(op, self=None, *args, out=None, **kwargs):
    s = {"op": op, "self": self, "args": list(args), "out": out}
    if kwargs:
        s["kwargs"] = kwargs
    return s


def T(name):
    return {"tensor": name}


def D(name):
    return {"dtype": name}


def S(start=None, stop=None, step_=None):
    return {"slice": [start, stop, step_]}


# Layouts of the input "x", as (leaf sizes, prep steps producing "x" from "x0").
# The 2D ones are all logically [3, 4]; the 4D ones [2, 3, 4, 5].
LAYOUTS = {
    "contiguous": ([3, 4], []),
    "transposed": ([4, 3], [step("t", "x0", out="x")]),
    "expanded": ([3, 1], [step("expand", "x0", [3, 4], out="x")]),
    "sliced": ([3, 8], [step("slice", "x0", 1, 0, 8, 2, out="x")]),
    "size1": ([3, 1, 4], []),
    # contiguous despite a non-standard stride on its size-1 dim
    "size1-stride": ([3, 4], [step("t", "x0", out="xt"), step("narrow", "xt", 1, 0, 1, out="x")]),
    "size1-permuted": ([4, 1, 3], [step("permute", "x0", [2, 1, 0], out="x")]),
    "contiguous4d": ([2, 3, 4, 5], []),
    "permuted4d": ([2, 4, 5, 3], [step("permute", "x0", [0, 3, 1, 2], out="x")]),
    "vector": ([5], []),
    "scalar": ([], []),
}
SHAPE_OF = {"contiguous": [3, 4], "transposed": [3, 4], "expanded": [3, 4], "sliced": [3, 4],
            "size1": [3, 1, 4], "size1-stride": [4, 1], "size1-permuted": [3, 1, 4],
            "contiguous4d": [2, 3, 4, 5], "permuted4d": [2, 3, 4, 5], "vector": [5], "scalar": []}
ALL2D = ["contiguous", "transposed", "expanded", "sliced"]
LAYOUT_SET = ALL2D + ["size1-permuted", "permuted4d"]


class Case:
    def __init__(self, row, name, layout="contiguous", dtype="float32", signed=False,
                 requires_grad=False, others=None, pre=(), op_args=(), op_kwargs=None,
                 post=(), error=None, self_name="x", values=True, op=None):
        """One case of `row`: x (in `layout`), then `pre`, then the measured
        call, then `post`; `error` is the key phrase of the expected error."""
        self.row = row
        self.id = f"{row}.{name}"
        self.error = error
        self.values = values
        self.tensors = {}
        self.steps = []
        if layout is not None:
            sizes, prep = LAYOUTS[layout]
            leaf_name = "x0" if prep else "x"
            self.tensors[leaf_name] = leaf(sizes, dtype, signed, requires_grad)
            self.steps += [dict(s) for s in prep]
        for name_, spec in (others or {}).items():
            self.tensors[name_] = spec
        self.steps += list(pre)
        self.measure = len(self.steps)
        self.steps.append(step(op or row, self_name, *op_args, out="r", **(op_kwargs or {})))
        self.steps += list(post)


# --- the cases ----------------------------------------------------------------

def views():
    c = []
    # as_strided works on storage, whatever the input's layout
    c += [Case("as_strided", "contiguous", op_args=([2, 2], [1, 2], 1)),
          Case("as_strided", "transposed", "transposed", op_args=([3, 2], [4, 1], 0)),
          Case("as_strided", "overlapping", op_args=([3, 3], [1, 1])),
          Case("as_strided", "permuted4d", "permuted4d", op_args=([2, 3], [60, 1], 5))]
    c += [Case("chunk", "contiguous", op_args=(2, 1)),
          Case("chunk", "transposed", "transposed", op_args=(2, 0)),
          Case("chunk", "uneven", op_args=(3, 1)),
          Case("chunk", "permuted4d", "permuted4d", op_args=(3, 1)),
          Case("chunk", "size1", "size1", op_args=(2, 1))]
    c += [Case("diagonal", "contiguous"),
          Case("diagonal", "transposed-offset", "transposed", op_args=(1,)),
          Case("diagonal", "negative-offset", op_args=(-1,)),
          Case("diagonal", "permuted4d", "permuted4d", op_args=(0, 2, 3)),
          Case("diagonal", "same-dims", op_args=(0, 1, 1), error="diagonal dimensions cannot be identical 1, 1")]
    c += [Case("expand", "new-dim", "expanded", op_args=([2, 3, 4],)),
          Case("expand", "size1", "size1", op_args=([3, 5, 4],)),
          Case("expand", "minus-one", "size1", op_args=([-1, 2, -1],)),
          Case("expand", "transposed", "transposed", op_args=([2, 3, 4],)),
          Case("expand", "non-singleton", op_args=([3, 5],),
               error="The expanded size of the tensor (5) must match the existing size (4) at non-singleton dimension 1")]
    c += [Case("expand_as", "contiguous", "size1", others={"o": leaf([2, 3, 6, 4])}, op_args=(T("o"),)),
          Case("expand_as", "mismatch", others={"o": leaf([3, 5])}, op_args=(T("o"),),
               error="The expanded size of the tensor (5) must match the existing size (4)")]
    c += [Case("index", "integer", op_args=([1],)),
          Case("index", "slices", op_args=([S(1), S(None, None, 2)],)),
          Case("index", "int-and-slice", "transposed", op_args=([S(), 2],)),
          Case("index", "negative", "permuted4d", op_args=([-1, S(1, 3)],)),
          Case("index", "out-of-range", op_args=([5],), error="index 5 is out of bounds for dimension 0 with size 3"),
          Case("index", "zero-dim-int-tensor", "transposed", others={"i": leaf([], "int64")}, op_args=([S(), T("i")],))]
    # A tensor index copies (advanced indexing): the index_tensor row, op index.
    longs = {"i": leaf([2], "int64")}
    c += [Case("index_tensor", "long", others=longs, op_args=([T("i")],), op="index"),
          Case("index_tensor", "long-after-slice", others=longs, op_args=([S(), T("i")],), op="index"),
          Case("index_tensor", "long-transposed", "transposed", others=longs, op_args=([S(), T("i")],), op="index"),
          Case("index_tensor", "bool-mask", others={"m": leaf([3], "bool")}, op_args=([T("m")],), op="index"),
          Case("index_tensor", "long-out-of-range", others={"i": leaf([4], "int64")}, op_args=([T("i")],),
               op="index", error="is out of bounds for dimension 0 with size 3")]
    c += [Case("narrow", "contiguous", op_args=(1, 1, 2)),
          Case("narrow", "outer", op_args=(0, 1, 2)),
          Case("narrow", "transposed", "transposed", op_args=(0, 1, 2)),
          Case("narrow", "permuted4d", "permuted4d", op_args=(3, 0, 2)),
          Case("narrow", "too-long", op_args=(1, 3, 2), error="start (3) + length (2) exceeds dimension size (4)")]
    c += [Case("permute", "contiguous4d", "contiguous4d", op_args=([0, 2, 3, 1],)),
          Case("permute", "back-to-contiguous", "permuted4d", op_args=([0, 2, 3, 1],)),
          Case("permute", "transposed", "transposed", op_args=([1, 0],)),
          Case("permute", "negative", "contiguous4d", op_args=([-1, 0, 1, 2],)),
          Case("permute", "repeated", op_args=([0, 0],), error="permute(): duplicate dims are not allowed."),
          Case("permute", "wrong-count", op_args=([0],), error="number of dimensions in the tensor input does not match the length of the desired ordering of dimensions")]
    c += [Case("select", "inner", op_args=(1, 2)),
          Case("select", "outer", op_args=(0, 1)),
          Case("select", "transposed", "transposed", op_args=(0, 1)),
          Case("select", "negative", "permuted4d", op_args=(1, -1)),
          Case("select", "size1", "size1", op_args=(1, 0)),
          Case("select", "out-of-range", op_args=(0, 3), error="select(): index 3 out of range for tensor of size [3, 4] at dimension 0")]
    c += [Case("slice", "step", op_args=(1, 0, 4, 2)),
          Case("slice", "outer", op_args=(0, 1, 3)),
          Case("slice", "clamped-end", op_args=(1, 2, 100)),
          Case("slice", "transposed", "transposed", op_args=(0, 1, 3)),
          Case("slice", "permuted4d", "permuted4d", op_args=(2, 1, 4, 2)),
          Case("slice", "zero-step", op_args=(1, 0, 4, 0), error="slice step must be positive")]
    c += [Case("split", "contiguous", op_args=(2, 1)),
          Case("split", "uneven", op_args=(2, 0)),
          Case("split", "transposed", "transposed", op_args=(3, 1)),
          Case("split", "permuted4d", "permuted4d", op_args=(2, 3))]
    c += [Case("squeeze", "all", "size1"),
          Case("squeeze", "dim", "size1", op_args=(1,)),
          Case("squeeze", "non-singleton-dim", "size1", op_args=(0,)),
          Case("squeeze", "noop", "contiguous"),
          Case("squeeze", "permuted", "size1-permuted"),
          Case("squeeze", "stride", "size1-stride")]
    c += [Case("t", "contiguous"),
          Case("t", "transposed", "transposed"),
          Case("t", "vector", "vector"),
          Case("t", "expanded", "expanded"),
          Case("t", "3d", "size1", error="t() expects a tensor with <= 2 dimensions, but self is 3D")]
    c += [Case("transpose", "contiguous", op_args=(0, 1)),
          Case("transpose", "permuted4d", "permuted4d", op_args=(1, 3)),
          Case("transpose", "size1", "size1", op_args=(0, 2)),
          Case("transpose", "negative", "contiguous4d", op_args=(-1, -2)),
          Case("transpose", "same", op_args=(1, 1)),
          Case("transpose", "out-of-range", op_args=(0, 5),
               error="Dimension out of range (expected to be in range of [-2, 1], but got 5)")]
    c += [Case("unbind", "outer"),
          Case("unbind", "transposed", "transposed", op_args=(1,)),
          Case("unbind", "permuted4d", "permuted4d", op_args=(1,))]
    c += [Case("unsqueeze", "front", op_args=(0,)),
          Case("unsqueeze", "middle", op_args=(1,)),
          Case("unsqueeze", "back", op_args=(-1,)),
          Case("unsqueeze", "transposed", "transposed", op_args=(1,)),
          Case("unsqueeze", "expanded", "expanded", op_args=(1,)),
          Case("unsqueeze", "sliced", "sliced", op_args=(2,)),
          Case("unsqueeze", "out-of-range", op_args=(4,),
               error="Dimension out of range (expected to be in range of [-3, 2], but got 4)")]
    view_error = "view size is not compatible with input tensor's size and stride"
    c += [Case("view", "flat", op_args=([12],)),
          Case("view", "infer", op_args=([-1, 2],)),
          Case("view", "size1", "size1", op_args=([12],)),
          Case("view", "size1-stride", "size1-stride", op_args=([2, 2],)),
          Case("view", "permuted-mergeable", "permuted4d", op_args=([2, 3, 20],)),
          Case("view", "expanded-split", "expanded", op_args=([3, 2, 2],)),
          Case("view", "transposed", "transposed", op_args=([12],), error=view_error),
          Case("view", "permuted-unmergeable", "permuted4d", op_args=([6, 20],), error=view_error),
          Case("view", "expanded-flat", "expanded", op_args=([-1],), error=view_error),
          Case("view", "bad-numel", op_args=([5],), error="shape '[5]' is invalid for input of size 12"),
          Case("view", "two-minus-one", op_args=([-1, -1],), error="only one dimension can be inferred")]
    c += [Case("view_as", "contiguous", others={"o": leaf([6, 2])}, op_args=(T("o"),)),
          Case("view_as", "transposed", "transposed", others={"o": leaf([12])}, op_args=(T("o"),),
               error=view_error)]
    return c


def detaches():
    pre_mul = [step("mul", "x", 2.0, out="y")]
    c = [Case("detach", "contiguous"),
         Case("detach", "leaf-requires-grad", requires_grad=True),
         Case("detach", "non-leaf", requires_grad=True, pre=pre_mul, self_name="y"),
         Case("detach", "transposed", "transposed")]
    # detach_() changes autograd metadata only: a leaf that required grad stops requiring it
    c += [Case("detach_", "contiguous"),
          Case("detach_", "leaf-requires-grad", requires_grad=True),
          Case("detach_", "non-leaf", requires_grad=True, pre=pre_mul, self_name="y"),
          Case("detach_", "view-of-leaf", "transposed", requires_grad=True,
               error="Can't detach views in-place")]
    for row in ("data", "variable_data"):
        c += [Case(row, "contiguous"),
              Case(row, "leaf-requires-grad", requires_grad=True),
              Case(row, "non-leaf", requires_grad=True, pre=pre_mul, self_name="y"),
              Case(row, "transposed", "transposed")]
    return c


def may_alias():
    c = []
    for layout in LAYOUT_SET + ["size1-stride", "contiguous4d"]:
        c.append(Case("contiguous", layout, layout))
    c += [Case("cpu", "contiguous"), Case("cpu", "transposed", "transposed")]
    # Debian's torch has no CUDA: the C++ test skips cases marked no_oracle.
    c += [Case("cuda", "contiguous")]
    c += [Case("flatten", "contiguous"),
          Case("flatten", "transposed", "transposed"),
          Case("flatten", "permuted-mergeable", "permuted4d", op_args=(2, 3)),
          Case("flatten", "permuted-unmergeable", "permuted4d", op_args=(0, 1)),
          Case("flatten", "expanded", "expanded"),
          Case("flatten", "sliced", "sliced"),
          Case("flatten", "partial", "contiguous4d", op_args=(1, 2)),
          Case("flatten", "scalar", "scalar"),
          Case("flatten", "bad-dims", "contiguous4d", op_args=(2, 1),
               error="flatten() has invalid args: start_dim cannot come after end_dim")]
    c += [Case("reshape", "contiguous", op_args=([4, 3],)),
          Case("reshape", "transposed", "transposed", op_args=([-1],)),
          Case("reshape", "transposed-split", "transposed", op_args=([3, 2, 2],)),
          Case("reshape", "permuted-mergeable", "permuted4d", op_args=([2, 3, 20],)),
          Case("reshape", "permuted-unmergeable", "permuted4d", op_args=([6, 20],)),
          Case("reshape", "expanded-split", "expanded", op_args=([3, 2, 2],)),
          Case("reshape", "expanded-flat", "expanded", op_args=([-1],)),
          Case("reshape", "sliced", "sliced", op_args=([12],)),
          Case("reshape", "size1-permuted", "size1-permuted", op_args=([3, 4],)),
          Case("reshape", "bad-numel", op_args=([5],), error="shape '[5]' is invalid for input of size 12")]
    c += [Case("reshape_as", "contiguous", others={"o": leaf([2, 6])}, op_args=(T("o"),)),
          Case("reshape_as", "transposed", "transposed", others={"o": leaf([12])}, op_args=(T("o"),)),
          Case("reshape_as", "permuted-mergeable", "permuted4d", others={"o": leaf([2, 3, 20])},
               op_args=(T("o"),))]
    c += [Case("to", "same-dtype", op_args=(D("float32"),)),
          Case("to", "float64", op_args=(D("float64"),)),
          Case("to", "transposed-float64", "transposed", op_args=(D("float64"),)),
          Case("to", "sliced-float64", "sliced", op_args=(D("float64"),)),
          Case("to", "forced-copy", op_args=(D("float32"),), op_kwargs={"copy": True}),
          Case("to", "device-cpu", op_args=({"device": "cpu"},)),
          Case("to", "int64-to-float", dtype="int64", op_args=(D("float32"),)),
          Case("to", "float-to-int32", signed=True, op_args=(D("int32"),)),
          Case("to", "requires-grad", requires_grad=True, op_args=(D("float64"),))]
    return c


def copies():
    return [Case("clone", layout, layout) for layout in LAYOUT_SET] + [
        Case("clone", "requires-grad", requires_grad=True)]


OVERLAP_ERROR = "unsupported operation: more than one element of the written-to tensor refers to a single memory location"
PARTIAL_ERROR = ("unsupported operation: some elements of the input tensor and the written-to tensor "
                 "refer to a single memory location")
LEAF_ERROR = "a leaf Variable that requires grad is being used in an in-place operation."
VIEW_OF_LEAF_ERROR = "a view of a leaf Variable that requires grad is being used in an in-place operation."
SAVED_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"


def in_place():
    c = []
    # unary in-place ops: on a contiguous tensor and through views
    unary = {"abs_": True, "exp_": False, "log_": False, "neg_": True, "relu_": True,
             "sigmoid_": True, "sqrt_": False, "tanh_": True, "zero_": True}
    for row, signed in unary.items():
        c += [Case(row, "contiguous", signed=signed),
              Case(row, "transposed", "transposed", signed=signed),
              Case(row, "sliced", "sliced", signed=signed),
              # PyTorch 1.13 checks overlap in TensorIterator, which fill_/zero_ bypass
              Case(row, "expanded", "expanded", signed=signed,
                   error=None if row == "zero_" else OVERLAP_ERROR),
              Case(row, "leaf-requires-grad", requires_grad=True, signed=signed, error=LEAF_ERROR)]
    binary = {"add_": 1.5, "div_": 2.0, "mul_": 3.0, "sub_": 0.5}
    for row, scalar in binary.items():
        c += [Case(row, "scalar", op_args=(scalar,)),
              Case(row, "tensor", others={"o": leaf([3, 4])}, op_args=(T("o"),)),
              Case(row, "broadcast", "transposed", others={"o": leaf([4])}, op_args=(T("o"),)),
              Case(row, "sliced", "sliced", op_args=(scalar,)),
              Case(row, "expanded", "expanded", op_args=(scalar,), error=OVERLAP_ERROR),
              Case(row, "grow", "size1-stride", others={"o": leaf([4, 3])}, op_args=(T("o"),),
                   error="output with shape [4, 1] doesn't match the broadcast shape [4, 3]"),
              Case(row, "mismatch", others={"o": leaf([4, 4])}, op_args=(T("o"),),
                   error="The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0"),
              Case(row, "leaf-requires-grad", requires_grad=True, op_args=(scalar,), error=LEAF_ERROR),
              Case(row, "view-of-leaf", requires_grad=True, pre=[step("select", "x", 0, 1, out="v")],
                   self_name="v", op_args=(scalar,), error=VIEW_OF_LEAF_ERROR)]
    c += [Case("add_", "alpha", others={"o": leaf([3, 4])}, op_args=(T("o"),), op_kwargs={"alpha": 2.0}),
          Case("div_", "int-true-divide", dtype="int64", op_args=(2,),
               error="result type Float can't be cast to the desired output type Long"),
          Case("mul_", "no-grad-leaf", requires_grad=True, op_args=(2.0,),
               pre=[step("no_grad_begin")], post=[step("no_grad_end")])]
    # the backward-after-in-place hazard (hazards.md): pow saves its input w,
    # exp saves its result; writing either in place breaks backward, writing a
    # tensor nobody saved does not.
    grad_pre = [step("mul", "x", 2.0, out="w")]
    c += [Case("add_", "saved-input-then-backward", requires_grad=True, self_name="w",
               pre=grad_pre + [step("pow", "w", 2, out="z")], op_args=(1.0,),
               post=[step("sum", "z", out="l"), step("backward", "l")], error=SAVED_ERROR),
          Case("mul_", "saved-result-then-backward", requires_grad=True, self_name="z",
               pre=grad_pre + [step("exp", "w", out="z")], op_args=(2.0,),
               post=[step("sum", "z", out="l"), step("backward", "l")], error=SAVED_ERROR),
          Case("add_", "unsaved-then-backward", requires_grad=True, self_name="w",
               pre=grad_pre + [step("add", "w", 1.0, out="z")], op_args=(1.0,),
               post=[step("sum", "z", out="l"), step("backward", "l"), step("grad", "x", out="g")]),
          Case("sigmoid_", "view-then-backward", requires_grad=True, self_name="v",
               pre=grad_pre + [step("exp", "w", out="z"), step("select", "z", 0, 0, out="v")],
               post=[step("sum", "z", out="l"), step("backward", "l")], error=SAVED_ERROR)]
    c += [Case("clamp_", "both", signed=True, op_args=(-0.25, 0.5)),
          Case("clamp_", "min-only", "transposed", op_kwargs={"min": 1.0}),
          Case("clamp_", "expanded", "expanded", op_args=(0.0, 1.0), error=OVERLAP_ERROR)]
    c += [Case("copy_", "same-shape", others={"o": leaf([3, 4], signed=True)}, op_args=(T("o"),)),
          Case("copy_", "broadcast-into-transposed", "transposed", others={"o": leaf([4], signed=True)},
               op_args=(T("o"),)),
          Case("copy_", "from-float64", others={"o": leaf([3, 4], "float64")}, op_args=(T("o"),)),
          Case("copy_", "narrowing-to-int", dtype="int32", others={"o": leaf([3, 4], signed=True)},
               op_args=(T("o"),)),
          Case("copy_", "into-slice", "sliced", others={"o": leaf([3, 4])}, op_args=(T("o"),)),
          Case("copy_", "into-expanded", "expanded", others={"o": leaf([3, 4])}, op_args=(T("o"),),
               error=OVERLAP_ERROR),
          Case("copy_", "bad-shape", others={"o": leaf([5])}, op_args=(T("o"),),
               error="The size of tensor a (4) must match the size of tensor b (5) at non-singleton dimension 1"),
          Case("copy_", "leaf-requires-grad", requires_grad=True, others={"o": leaf([3, 4])},
               op_args=(T("o"),), error=LEAF_ERROR)]
    # an input partially overlapping the output (at::assert_no_partial_overlap):
    # only two non-overlapping, dense tensors of one storage are compared
    rows = lambda a, b: [step("narrow", "x", 0, a, 2, out="d"), step("narrow", "x", 0, b, 2, out="s")]
    cols = [step("narrow", "x", 1, 1, 3, out="d"), step("narrow", "x", 1, 0, 3, out="s")]
    c += [Case("add_", "partial-overlap-transpose", pre=[step("t", "x", out="y")], op_args=(T("y"),),
               error=PARTIAL_ERROR),
          Case("add_", "full-overlap", op_args=(T("x"),)),
          Case("copy_", "partial-overlap-rows", pre=rows(1, 0), self_name="d", op_args=(T("s"),),
               error=PARTIAL_ERROR),
          Case("mul_", "partial-overlap-rows", pre=rows(0, 1), self_name="d", op_args=(T("s"),),
               error=PARTIAL_ERROR),
          Case("copy_", "disjoint-rows", pre=[step("narrow", "x", 0, 0, 1, out="d"),
                                              step("narrow", "x", 0, 2, 1, out="s")],
               self_name="d", op_args=(T("s"),)),
          Case("copy_", "overlap-too-hard-cols", pre=cols, self_name="d", op_args=(T("s"),),
               values=False)]
    c += [Case("fill_", "contiguous", op_args=(2.5,)),
          Case("fill_", "transposed", "transposed", op_args=(-1.0,)),
          Case("fill_", "sliced", "sliced", op_args=(7.0,)),
          Case("fill_", "int", dtype="int64", op_args=(3,)),
          Case("fill_", "expanded", "expanded", op_args=(1.0,))]
    c += [Case("index_put_", "row", others={"o": leaf([4])}, op_args=([1], T("o"))),
          Case("index_put_", "scalar-into-slice", "transposed", op_args=([S(), S(1, 3)], 5.0)),
          Case("index_put_", "element", op_args=([2, 3], 9.0)),
          Case("index_put_", "leaf-requires-grad", requires_grad=True, op_args=([0], 1.0),
               error=LEAF_ERROR)]
    c += [Case("pow_", "square", signed=True, op_args=(2,)),
          Case("pow_", "sqrt", "transposed", op_args=(0.5,)),
          Case("pow_", "tensor", others={"o": leaf([3, 4], signed=True)}, op_args=(T("o"),)),
          Case("pow_", "expanded", "expanded", op_args=(2,), error=OVERLAP_ERROR)]
    c += [Case("requires_grad_", "leaf"),
          Case("requires_grad_", "leaf-off", requires_grad=True, op_args=(False,)),
          Case("requires_grad_", "transposed", "transposed"),
          Case("requires_grad_", "non-leaf", requires_grad=True, pre=[step("mul", "x", 2.0, out="y")],
               self_name="y", op_args=(False,), error="you can only change requires_grad flags of leaf variables."),
          Case("requires_grad_", "int", dtype="int64",
               error="only Tensors of floating point dtype can require gradients")]
    return c


def fresh():
    c = []
    unary = {"abs": True, "exp": False, "log": False, "neg": True, "relu": True,
             "sigmoid": True, "sqrt": False, "tanh": True}
    for row, signed in unary.items():
        c += [Case(row, layout, layout, signed=signed) for layout in LAYOUT_SET]
        c += [Case(row, "requires-grad", requires_grad=True, signed=signed)]
    c += [Case("abs", "int", dtype="int64", signed=True)]
    binary = ["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge"]
    for row in binary:
        sg = row != "div"  # no zero divisors
        c += [Case(row, "tensor", others={"o": leaf([3, 4], signed=sg)}, op_args=(T("o"),)),
              Case(row, "scalar", op_args=(1.5,)),
              Case(row, "broadcast-row", "transposed", others={"o": leaf([4], signed=sg)}, op_args=(T("o"),)),
              Case(row, "broadcast-outer", "size1-stride", others={"o": leaf([1, 3], signed=sg)},
                   op_args=(T("o"),)),
              Case(row, "both-transposed", "transposed", others={"o0": leaf([4, 3], signed=sg)},
                   pre=[step("t", "o0", out="o")], op_args=(T("o"),)),
              Case(row, "permuted4d", "permuted4d", others={"o": leaf([5], signed=sg)}, op_args=(T("o"),)),
              Case(row, "expanded", "expanded", op_args=(2.0,)),
              Case(row, "int-with-float", dtype="int64", op_args=(0.5,)),
              Case(row, "mismatch", others={"o": leaf([4, 3])}, op_args=(T("o"),),
                   error="The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1")]
    c += [Case("add", "alpha", others={"o": leaf([3, 4])}, op_args=(T("o"),), op_kwargs={"alpha": 2.0}),
          Case("sub", "alpha", others={"o": leaf([3, 4])}, op_args=(T("o"),), op_kwargs={"alpha": 2.0}),
          Case("div", "int-true-divide", dtype="int64", op_args=(2,)),
          Case("add", "requires-grad", requires_grad=True, op_args=(1.0,))]
    c += [Case("clamp", "both", signed=True, op_args=(-0.25, 0.5)),
          Case("clamp", "transposed-min", "transposed", op_kwargs={"min": 1.0}),
          Case("clamp", "max-only", "permuted4d", op_kwargs={"max": 2.0}),
          Case("clamp", "neither", error="At least one of 'min' or 'max' must not be None")]
    c += [Case("pow", "square", signed=True, op_args=(2,)),
          Case("pow", "sqrt", "transposed", op_args=(0.5,)),
          Case("pow", "tensor", others={"o": leaf([3, 4], signed=True)}, op_args=(T("o"),)),
          Case("pow", "permuted4d", "permuted4d", op_args=(3,))]
    for row in ("sum", "mean"):
        c += [Case(row, "all"),
              Case(row, "dim", op_args=([1],)),
              Case(row, "keepdim", "transposed", op_args=([0],), op_kwargs={"keepdim": True}),
              Case(row, "permuted4d", "permuted4d", op_args=([1, 3],)),
              Case(row, "negative-dim", "contiguous4d", op_args=([-1],)),
              Case(row, "dim-out-of-range", op_args=([2],),
                   error="Dimension out of range (expected to be in range of [-2, 1], but got 2)")]
    c += [Case("sum", "int", dtype="int32"),
          Case("mean", "int", dtype="int64",
               error="mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: Long")]
    for row in ("max", "min"):
        c += [Case(row, "all", signed=True),
              Case(row, "dim", op_args=(1,)),
              Case(row, "keepdim", "transposed", op_args=(0,), op_kwargs={"keepdim": True}),
              Case(row, "permuted4d", "permuted4d", op_args=(2,))]
    c += [Case("argmax", "all"),
          Case("argmax", "dim", op_args=(1,)),
          Case("argmax", "keepdim", "transposed", op_args=(0,), op_kwargs={"keepdim": True}),
          Case("argmax", "permuted4d", "permuted4d", op_args=(1,))]
    c += [Case("mm", "contiguous", others={"o": leaf([4, 5])}, op_args=(T("o"),)),
          Case("mm", "transposed", "transposed", others={"o0": leaf([5, 4])}, pre=[step("t", "o0", out="o")],
               op_args=(T("o"),)),
          Case("mm", "sliced", "sliced", others={"o": leaf([4, 2])}, op_args=(T("o"),)),
          Case("mm", "float64", dtype="float64", others={"o": leaf([4, 2], "float64")}, op_args=(T("o"),)),
          Case("mm", "mismatch", others={"o": leaf([5, 4])}, op_args=(T("o"),),
               error="mat1 and mat2 shapes cannot be multiplied (3x4 and 5x4)")]
    c += [Case("bmm", "contiguous", "size1", others={"o": leaf([3, 4, 2])}, op_args=(T("o"),)),
          Case("bmm", "permuted", "contiguous4d", pre=[step("select", "x", 0, 1, out="x3"),
                                                       step("transpose", "x3", 1, 2, out="xt")],
               self_name="xt", others={"o": leaf([3, 4, 2])}, op_args=(T("o"),)),
          Case("bmm", "not-3d", others={"o": leaf([4, 2])}, op_args=(T("o"),),
               error="batch1 must be a 3D tensor")]
    c += [Case("matmul", "2d", others={"o": leaf([4, 2])}, op_args=(T("o"),)),
          Case("matmul", "vector-vector", "vector", others={"o": leaf([5])}, op_args=(T("o"),)),
          Case("matmul", "matrix-vector", others={"o": leaf([4])}, op_args=(T("o"),)),
          Case("matmul", "vector-matrix", "vector", others={"o": leaf([5, 2])}, op_args=(T("o"),)),
          Case("matmul", "batched-broadcast", "contiguous4d", others={"o": leaf([5, 2])}, op_args=(T("o"),)),
          Case("matmul", "transposed", "transposed", others={"o": leaf([4, 3])}, op_args=(T("o"),)),
          Case("matmul", "mismatch", others={"o": leaf([3, 4])}, op_args=(T("o"),),
               error="mat1 and mat2 shapes cannot be multiplied (3x4 and 3x4)")]
    mask = {"c": leaf([3, 4], "bool")}
    c += [Case("where", "contiguous", others={**mask, "o": leaf([3, 4], signed=True)}, self_name="c",
               op_args=(T("x"), T("o"))),
          Case("where", "broadcast", others={**mask, "o": leaf([4], signed=True)}, self_name="c",
               op_args=(T("x"), T("o"))),
          Case("where", "transposed", "transposed", others={"c0": leaf([4, 3], "bool"), "o0": leaf([4, 3])},
               pre=[step("t", "c0", out="c"), step("t", "o0", out="o")], self_name="c",
               op_args=(T("x"), T("o"))),
          Case("where", "scalar-other", others=mask, self_name="c", op_args=(T("x"), 0.0))]
    return c


def factories():
    c = []

    def fac(row, name, *args, values=True, like=None, error=None, **kwargs):
        return Case(row, name, like, op_args=args, op_kwargs=kwargs, values=values, error=error,
                    self_name="x" if like else None)

    c += [fac("arange", "end-int", 5),
          fac("arange", "float-step", 1.0, 4.0, 0.5),
          fac("arange", "int-step", 0, 10, 3),
          fac("arange", "dtype", 4, dtype=D("float64")),
          fac("arange", "zero-step", 0, 4, 0, error="step must be nonzero")]
    c += [fac("empty", "2d", [2, 3], values=False),
          fac("empty", "dtype", [4], values=False, dtype=D("int64")),
          fac("empty_like", "transposed", values=False, like="transposed"),
          fac("empty_like", "sliced", values=False, like="sliced"),
          fac("full", "float", [2, 3], 1.5),
          fac("full", "int", [2, 2], 7),
          fac("full", "dtype", [3], 2, dtype=D("float64")),
          fac("full_like", "transposed", 4.0, like="transposed"),
          fac("linspace", "five", 0.0, 1.0, 5),
          fac("linspace", "one", 2.0, 3.0, 1),
          fac("ones", "2d", [2, 3]),
          fac("ones", "int", [3], dtype=D("int32")),
          fac("ones_like", "permuted4d", like="permuted4d"),
          fac("ones_like", "expanded", like="expanded"),
          fac("rand", "2d", [2, 3], values=False),
          fac("randn", "2d", [3, 2], values=False),
          fac("randn", "float64", [4], values=False, dtype=D("float64")),
          fac("tensor", "floats", [1.5, 2.0, -3.0]),
          fac("tensor", "ints", [1, 2, 3]),
          fac("tensor", "bools", [True, False]),
          fac("zeros", "2d", [2, 3]),
          fac("zeros", "scalar", []),
          fac("zeros_like", "transposed", like="transposed"),
          fac("zeros_like", "size1-stride", like="size1-stride"),
          fac("zeros", "negative", [2, -1], error="Trying to create tensor with negative dimension -1")]
    return c


def backward_post(leaf):
    """sum the result, backward, read the leaf's gradient (compared as "post")."""
    return [step("sum", "r", out="l"), step("backward", "l"), step("grad", leaf, out="g")]


def gradients():
    """Values of backward through one op, on a leaf that requires grad."""
    c = []

    def g(row, layout="contiguous", signed=False, **kw):
        leaf_name = "x0" if LAYOUTS[layout][1] else "x"
        return Case(row, "backward-" + layout, layout, signed=signed, requires_grad=True,
                    post=backward_post(leaf_name), **kw)

    for row in ("abs", "exp", "log", "neg", "sigmoid", "sqrt", "tanh", "clone"):
        c.append(g(row, "transposed", signed=row in ("abs", "neg", "sigmoid", "tanh")))
    c += [g("relu", signed=True), g("clamp", signed=True, op_args=(-0.25, 0.5)),
          g("pow", op_args=(3,)), g("contiguous", "transposed"), g("reshape", "transposed", op_args=([12],)),
          g("view", op_args=([2, 6],)), g("permute", "contiguous4d", op_args=([0, 2, 3, 1],)),
          g("expand", "size1", op_args=([3, 5, 4],)), g("select", "transposed", op_args=(1, 2)),
          g("unsqueeze", op_args=(1,)), g("diagonal"), g("t", "sliced"),
          g("mean", op_args=([1],)), g("max"), g("sum", "permuted4d", op_args=([1, 3],))]
    for row in ("add", "sub", "mul", "div"):
        c.append(g(row, "transposed", others={"o": leaf([4], signed=row != "div")}, op_args=(T("o"),)))
    c += [g("mm", others={"o": leaf([4, 2])}, op_args=(T("o"),)),
          g("matmul", "contiguous4d", others={"o": leaf([5, 2])}, op_args=(T("o"),)),
          g("bmm", "size1", others={"o": leaf([3, 4, 2])}, op_args=(T("o"),))]
    return c


def all_cases():
    return (views() + detaches() + may_alias() + copies() + in_place() + fresh() + factories()
            + gradients())


# --- the PyTorch side of the interpreter -----------------------------------------

def resolve(arg, env):
    if isinstance(arg, dict):
        if "tensor" in arg:
            return env[arg["tensor"]]
        if "dtype" in arg:
            return DTYPES[arg["dtype"]]
        if "device" in arg:
            return torch.device(arg["device"])
        if "slice" in arg:
            return slice(*arg["slice"])
    if isinstance(arg, list):
        return [resolve(a, env) for a in arg]
    return arg


FACTORIES = {"arange", "empty", "full", "linspace", "ones", "rand", "randn", "tensor", "zeros",
             "empty_like", "full_like", "ones_like", "zeros_like"}


def call(op, self, args, kwargs):
    if op == "slice":
        return torch.ops.aten.slice(self, *args)
    if op == "index":
        return self[tuple(args[0])]
    if op == "index_put_":
        self[tuple(args[0])] = args[1]
        return self
    if op in ("data", "variable_data"):  # Python's .data is LibTorch's variable_data()
        return self.data
    if op == "where":
        return torch.where(self, *args)
    if op == "grad":
        return self.grad
    if op in FACTORIES:
        if self is not None:
            return getattr(torch, op)(self, *args, **kwargs)
        if op in ("zeros", "ones", "empty", "rand", "randn"):
            return getattr(torch, op)(args[0], **kwargs)
        return getattr(torch, op)(*args, **kwargs)
    return getattr(self, op)(*args, **kwargs)


def as_list(result):
    if result is None:
        return []
    if isinstance(result, torch.Tensor):
        return [result]
    return list(result)


def storage_ptr(t):
    return t.storage().data_ptr()


def describe(case, r, x=None, values=False):
    d = {"sizes": list(r.shape), "strides": list(r.stride()), "storage_offset": r.storage_offset(),
         "contiguous": r.is_contiguous(), "dtype": DTYPE_NAMES[r.dtype],
         "requires_grad": r.requires_grad}
    if x is not None:
        d["aliases_input"] = storage_ptr(r) == storage_ptr(x)
        d["is_input"] = r is x
    if values:
        vals = r.detach().reshape(-1)[:MAX_VALUES].tolist()
        for v in vals:
            if isinstance(v, float) and not math.isfinite(v):
                sys.exit(f"{case.id}: non-finite value in a result: pick other inputs")
        d["values"] = vals
    return d


def shares_version_counter(r, x):
    """Probe: does an in-place write through r bump x's version counter?"""
    if r.dtype == torch.bool:
        return None
    before = x._version
    try:
        with torch.no_grad():
            r.add_(0)
    except RuntimeError:  # e.g. r is expanded
        return None
    return x._version != before


def run_case(case, rows):
    torch.manual_seed(0)
    env = {}
    for name, spec in case.tensors.items():
        t = torch.tensor(spec["values"], dtype=DTYPES[spec["dtype"]]).reshape(spec["sizes"]).clone()  # a leaf, not a view of the flat values
        env[name] = t.requires_grad_(spec["requires_grad"])
    expect = {"error": None}
    grad_mode = []
    x = None
    results = []
    version_before = None
    for i, s in enumerate(case.steps):
        if s["op"] == "no_grad_begin":
            grad_mode.append(torch.no_grad())
            grad_mode[-1].__enter__()
            continue
        if s["op"] == "no_grad_end":
            grad_mode.pop().__exit__(None, None, None)
            continue
        self = env[s["self"]] if s["self"] is not None else None
        if i == case.measure:
            x = self
            version_before = x._version if x is not None else None
            if x is not None:
                expect["input"] = describe(case, x)
        try:
            r = call(s["op"], self, resolve(s["args"], env),
                     {k: resolve(v, env) for k, v in s.get("kwargs", {}).items()})
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            msg = str(e)
            if case.error is None:
                sys.exit(f"{case.id}: step {i} ({s['op']}) raised unexpectedly: {msg}")
            if case.error not in msg:
                sys.exit(f"{case.id}: step {i} ({s['op']}) raised\n  {msg}\nwhich lacks the key\n  {case.error}")
            expect["error"] = {"step": i, "key": case.error, "message": msg.split("\n")[0]}
            break
        if s["out"] is not None:
            env[s["out"]] = r if isinstance(r, torch.Tensor) else None
            if not isinstance(r, torch.Tensor):  # tuples: out[0], out[1], ...
                for j, t in enumerate(as_list(r)):
                    env[f"{s['out']}[{j}]"] = t
        if i == case.measure:
            results = as_list(r)
            expect["results"] = [describe(case, t, x, case.values) for t in results]
            if x is not None:
                expect["version_bumped"] = x._version != version_before
    while grad_mode:
        grad_mode.pop().__exit__(None, None, None)
    if expect["error"] is None:  # what the steps after the op computed (losses, gradients)
        post = {s["out"]: env[s["out"]] for s in case.steps[case.measure + 1:]
                if s["out"] is not None and isinstance(env.get(s["out"]), torch.Tensor)}
        if post:
            expect["post"] = {k: describe(case, t, None, True) for k, t in post.items()}
    if case.error is not None and expect["error"] is None:
        sys.exit(f"{case.id}: expected an error with '{case.error}', PyTorch raised none")
    if expect["error"] is None and x is not None and rows[case.row][0] in ("View", "MayAlias", "Detach"):
        expect["shares_version_counter"] = [
            shares_version_counter(t, x) if d["aliases_input"] else None
            for t, d in zip(results, expect["results"])]
    return expect


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=str(DEFAULT_OUT))
    opts = ap.parse_args()

    rows = {name: (storage, layout, autograd) for name, storage, layout, autograd in parse_ops_def(OPS_DEF)}
    cases = all_cases()
    seen, covered = set(), set()
    for case in cases:
        if case.row not in rows:
            sys.exit(f"case {case.id}: '{case.row}' is not a row of {OPS_DEF.name}")
        if case.id in seen:
            sys.exit(f"duplicate case id {case.id}")
        seen.add(case.id)
        covered.add(case.row)
    missing = [r for r in rows if r not in covered]
    if missing:
        sys.exit(f"rows of {OPS_DEF.name} without a conformance case (add them to {__file__}): "
                 + ", ".join(missing))

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = []
    for case in cases:
        entry = {"id": case.id, "row": case.row, "tensors": case.tensors, "steps": case.steps,
                 "measure": case.measure}
        if case.row == "cuda":
            entry["no_oracle"] = "Debian's PyTorch is built without CUDA"
            out.append(entry)
            continue
        entry["expect"] = run_case(case, rows)
        out.append(entry)

    lines = ["{", f' "generator": "scripts/gen_conformance.py",', f' "torch": "{torch.__version__}",',
             ' "cases": [']
    lines += ["  " + json.dumps(e, separators=(",", ":"), allow_nan=False)
              + ("," if i + 1 < len(out) else "") for i, e in enumerate(out)]
    lines += [" ]", "}"]
    pathlib.Path(opts.output).write_text("\n".join(lines) + "\n")
    print(f"{len(out)} cases for {len(rows)} rows -> {opts.output}")


if __name__ == "__main__":
    main()
