// Differential test of the runtime against LibTorch 1.13, in one process
// (docs/robustness.md). A seeded generator draws op sequences over the op
// table (views, reshapes, in-place writes, copies, math, autograd with
// backward) on tensors of random shapes; each sequence runs on tt::Tensor and
// on at::Tensor, and after every op the two are compared: which ops threw and
// with what message, and for every live handle its sizes, strides, storage
// offset, values, version counter, requires_grad, grad_fn and which handles
// share storage (is_alias_of). Gradients are compared after backward.
//
//   tt_diff [--seeds=FIRST:LAST] [--steps=N] [--verbose]
//
// Prints one line per disagreement and a summary; exits 1 on any that is not
// a known, documented difference (KnownDifferences below, docs/robustness.md).
#include "tt/tt.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Shape = std::vector<std::int64_t>;

// --- the two libraries behind one interface -------------------------------------------
// The same methods on both handles; only the factory differs.

tt::Tensor arangeOf(tt::Tensor *, std::int64_t N) { return tt::arange(N, tt::kFloat); }
at::Tensor arangeOf(at::Tensor *, std::int64_t N) { return at::arange(N, at::kFloat); }

/// Values -N/8 .. N/8 in steps of 1/4, of shape S; a leaf that requires grad if asked.
template <class Tensor> Tensor leaf(const Shape &S, bool Grad) {
  std::int64_t N = 1;
  for (std::int64_t D : S)
    N *= D;
  Tensor T =
      arangeOf(static_cast<Tensor *>(nullptr), N).sub(N / 2.0).div(4.0).reshape(S).contiguous();
  return Grad ? T.detach().requires_grad_(true) : T;
}

template <class Tensor> std::vector<double> values(const Tensor &T) {
  Tensor C = T.detach().contiguous();
  const float *P = C.template data_ptr<float>();
  return std::vector<double>(P, P + C.numel());
}

// --- the op sequence --------------------------------------------------------------------

enum OpKind {
  View,
  Reshape,
  Transpose,
  T,
  Permute,
  Narrow,
  Select,
  Slice,
  Unsqueeze,
  Squeeze,
  Expand,
  Flatten,
  Contiguous,
  Clone,
  Detach,
  Diagonal,
  AddS_,
  MulS_,
  Zero_,
  Copy_,
  Add,
  MulS,
  Sum,
  SumDim,
  Exp,
  Relu_,
  Matmul,
  Backward,
  NumOps
};

const char *const OpNames[] = {
    "view",   "reshape",   "transpose", "t",      "permute", "narrow",     "select",
    "slice",  "unsqueeze", "squeeze",   "expand", "flatten", "contiguous", "clone",
    "detach", "diagonal",  "add_",      "mul_",   "zero_",   "copy_",      "add",
    "mul",    "sum",       "sum(dim)",  "exp",    "relu_",   "matmul",     "backward"};
static_assert(sizeof(OpNames) / sizeof(OpNames[0]) == NumOps);

/// One op, its parameters drawn from the generator (never from a library).
struct Op {
  OpKind Kind;
  std::size_t Self = 0, Other = 0; // indices into the pool
  std::int64_t A = 0, B = 0, C = 0;
  Shape Dims;
  double Scalar = 0;
  std::string str() const {
    std::ostringstream OS;
    OS << OpNames[Kind] << "(#" << Self;
    if (Kind == Copy_ || Kind == Add || Kind == Matmul)
      OS << ", #" << Other;
    OS << "; " << A << "," << B << "," << C << "; [";
    for (std::int64_t D : Dims)
      OS << D << " ";
    OS << "]; " << Scalar << ")";
    return OS.str();
  }
};

/// A random factorisation of N into 1-4 dims, one of them -1 sometimes.
Shape randomShapeOf(std::mt19937 &R, std::int64_t N, bool AllowInfer) {
  Shape S;
  std::int64_t Left = N;
  int Dims = 1 + R() % 4;
  for (int I = 0; I + 1 < Dims && Left > 0; ++I) {
    std::vector<std::int64_t> Divs;
    for (std::int64_t D = 1; D <= Left; ++D)
      if (Left % D == 0)
        Divs.push_back(D);
    std::int64_t D = Divs[R() % Divs.size()];
    S.push_back(D);
    Left /= D;
  }
  S.push_back(Left);
  if (AllowInfer && R() % 3 == 0)
    S[R() % S.size()] = -1;
  return S;
}

std::int64_t pick(std::mt19937 &R, std::int64_t Lo, std::int64_t Hi) { // [Lo, Hi]
  return Hi < Lo ? Lo : Lo + static_cast<std::int64_t>(R() % (Hi - Lo + 1));
}

/// Parameters from the self tensor's shape: mostly valid, sometimes out of
/// range (both libraries must then throw, with the same words).
Op drawOp(std::mt19937 &R, const std::vector<Shape> &PoolShapes) {
  Op O;
  O.Kind = static_cast<OpKind>(R() % NumOps);
  O.Self = R() % PoolShapes.size();
  O.Other = R() % PoolShapes.size();
  const Shape &S = PoolShapes[O.Self];
  std::int64_t Rank = S.size(), N = 1;
  for (std::int64_t D : S)
    N *= D;
  bool Wild = R() % 10 == 0;
  std::int64_t DimHi = Wild ? Rank : Rank - 1;
  O.A = Rank ? pick(R, Wild ? -Rank - 1 : -Rank, DimHi) : 0;
  O.B = Rank ? pick(R, 0, DimHi) : 0;
  std::int64_t Size = Rank ? S[((O.A % Rank) + Rank) % Rank] : 1;
  O.C = pick(R, 0, Size);
  O.Scalar = static_cast<double>(pick(R, -4, 4)) / 2;
  switch (O.Kind) {
  case View:
  case Reshape:
    O.Dims = Wild ? randomShapeOf(R, N + 1, true) : randomShapeOf(R, N, true);
    break;
  case Permute:
    for (std::int64_t I = 0; I < Rank; ++I)
      O.Dims.push_back(I);
    std::shuffle(O.Dims.begin(), O.Dims.end(), R);
    if (Wild && !O.Dims.empty())
      O.Dims.pop_back();
    break;
  case Expand:
    O.Dims = S;
    for (std::int64_t &D : O.Dims)
      if (D == 1 || Wild)
        D = pick(R, 1, 3);
    if (R() % 2)
      O.Dims.insert(O.Dims.begin(), pick(R, 1, 3));
    break;
  case Slice:
    O.Dims = {pick(R, 1, 3)}; // step
    break;
  default:
    break;
  }
  return O;
}

template <class Tensor> Tensor applyView(const Op &O, const Tensor &X) {
  switch (O.Kind) {
  case View:
    return X.view(O.Dims);
  case Reshape:
    return X.reshape(O.Dims);
  case Transpose:
    return X.transpose(O.A, O.B);
  case T:
    return X.t();
  case Permute:
    return X.permute(O.Dims);
  case Narrow:
    return X.narrow(O.A, O.C / 2, O.C - O.C / 2);
  case Select:
    return X.select(O.A, O.C == 0 ? 0 : O.C - 1);
  case Slice:
    return X.slice(O.A, O.C / 2, O.C, O.Dims[0]);
  case Unsqueeze:
    return X.unsqueeze(O.A);
  case Squeeze:
    return X.squeeze();
  case Expand:
    return X.expand(O.Dims);
  case Flatten:
    return X.flatten();
  case Contiguous:
    return X.contiguous();
  case Clone:
    return X.clone();
  case Detach:
    return X.detach();
  case Diagonal:
    return X.diagonal(0, O.A, O.B);
  default:
    return Tensor();
  }
}

/// Runs O on the pool; a new tensor (if any) is appended to it.
template <class Tensor> void apply(const Op &O, std::vector<Tensor> &Pool) {
  const Tensor &X = Pool[O.Self];
  const Tensor &Y = Pool[O.Other];
  Tensor Out;
  switch (O.Kind) {
  case AddS_:
    X.add_(O.Scalar);
    break;
  case MulS_:
    X.mul_(O.Scalar);
    break;
  case Zero_:
    X.zero_();
    break;
  case Copy_:
    X.copy_(Y);
    break;
  case Relu_:
    X.relu_();
    break;
  case Add:
    Out = X.add(Y);
    break;
  case MulS:
    Out = X.mul(O.Scalar);
    break;
  case Sum:
    Out = X.sum();
    break;
  case SumDim:
    Out = X.sum(Shape{O.A});
    break;
  case Exp:
    Out = X.exp();
    break;
  case Matmul:
    Out = X.matmul(Y);
    break;
  case Backward:
    X.sum().backward();
    break;
  default:
    Out = applyView(O, X);
    break;
  }
  if (Out.defined())
    Pool.push_back(Out);
}

// --- observing and comparing --------------------------------------------------------------

struct Observation {
  bool Threw = false;
  std::string Error;
  std::vector<Shape> Sizes, Strides;
  std::vector<std::int64_t> Offsets;
  std::vector<std::uint32_t> Versions;
  std::vector<std::vector<double>> Values, Grads;
  std::vector<int> RequiresGrad, GradFn, Alias; // Alias: pairs i<j, row-major
};

template <class Tensor> Observation observe(const std::vector<Tensor> &Pool) {
  Observation Obs;
  for (const Tensor &X : Pool) {
    Obs.Sizes.emplace_back(X.sizes().begin(), X.sizes().end());
    Obs.Strides.emplace_back(X.strides().begin(), X.strides().end());
    Obs.Offsets.push_back(X.storage_offset());
    Obs.Versions.push_back(X._version());
    Obs.Values.push_back(values(X));
    Obs.RequiresGrad.push_back(X.requires_grad());
    Obs.GradFn.push_back(X.grad_fn() != nullptr);
    Obs.Grads.push_back(X.is_leaf() && X.grad().defined() ? values(X.grad())
                                                          : std::vector<double>{});
  }
  for (std::size_t I = 0; I < Pool.size(); ++I)
    for (std::size_t J = I + 1; J < Pool.size(); ++J)
      Obs.Alias.push_back(Pool[I].is_alias_of(Pool[J]));
  return Obs;
}

std::string errorText(const std::exception &E) {
  if (const auto *C = dynamic_cast<const c10::Error *>(&E))
    return C->what_without_backtrace();
  return E.what();
}

/// tt speaks PyTorch's Python spelling of a tensor type ("torch.FloatTensor",
/// as docs and users quote it); LibTorch's C++ says "CPUFloatType".
std::string pythonTypeNames(std::string Msg) {
  for (const char *Type : {"Float", "Double", "Long", "Int", "Bool", "Half"}) {
    std::string Cpp = std::string("CPU") + Type + "Type",
                Py = std::string("torch.") + Type + "Tensor";
    for (std::size_t At; (At = Msg.find(Cpp)) != std::string::npos;)
      Msg.replace(At, Cpp.size(), Py);
  }
  return Msg;
}

/// The same words: tt's message (its first line) appears in LibTorch's.
bool sameError(const std::string &Tt, const std::string &Torch) {
  std::string First = Tt.substr(0, Tt.find('\n'));
  return !First.empty() && pythonTypeNames(Torch).find(First) != std::string::npos;
}

bool closeValues(const std::vector<double> &A, const std::vector<double> &B) {
  if (A.size() != B.size())
    return false;
  for (std::size_t I = 0; I < A.size(); ++I) {
    if (A[I] == B[I] || (std::isnan(A[I]) && std::isnan(B[I])))
      continue; // equal infinities too
    if (!(std::fabs(A[I] - B[I]) <= 1e-4 + 1e-4 * std::fabs(B[I])))
      return false;
  }
  return true;
}

std::string str(const Shape &S) {
  std::string Out = "[";
  for (std::size_t I = 0; I < S.size(); ++I)
    Out += (I ? ", " : "") + std::to_string(S[I]);
  return Out + "]";
}

/// Strides that differ only where the size is 1 (no element steps along
/// them), or of a tensor with no elements.
bool onlySizeOneDims(const Shape &Sizes, const Shape &A, const Shape &B) {
  if (std::find(Sizes.begin(), Sizes.end(), 0) != Sizes.end())
    return true;
  for (std::size_t I = 0; I < Sizes.size(); ++I)
    if (Sizes[I] != 1 && A[I] != B[I])
      return false;
  return true;
}

/// The first field in which the two observations differ, or "".
std::string firstDifference(const Observation &Tt, const Observation &Torch) {
  if (Tt.Threw != Torch.Threw)
    return Tt.Threw ? "error: tt threw '" + Tt.Error + "', LibTorch did not"
                    : "error: LibTorch threw '" + Torch.Error + "', tt did not";
  if (Tt.Threw)
    return sameError(Tt.Error, Torch.Error)
               ? ""
               : "message: tt '" + Tt.Error + "' vs LibTorch '" + Torch.Error + "'";
  if (Tt.Sizes.size() != Torch.Sizes.size())
    return "pool size";
  for (std::size_t I = 0; I < Tt.Sizes.size(); ++I) {
    std::string H = " of #" + std::to_string(I);
    if (Tt.Sizes[I] != Torch.Sizes[I])
      return "sizes" + H + ": tt " + str(Tt.Sizes[I]) + ", LibTorch " + str(Torch.Sizes[I]);
    if (Tt.Strides[I] != Torch.Strides[I])
      return (onlySizeOneDims(Tt.Sizes[I], Tt.Strides[I], Torch.Strides[I])
                  ? "strides of size-1 dims"
                  : "strides") +
             H + " (sizes " + str(Tt.Sizes[I]) + "): tt " + str(Tt.Strides[I]) + ", LibTorch " +
             str(Torch.Strides[I]);
    if (Tt.Offsets[I] != Torch.Offsets[I])
      return "storage offset" + H;
    if (!closeValues(Tt.Values[I], Torch.Values[I]))
      return "values" + H;
    if (Tt.Versions[I] != Torch.Versions[I])
      return "version" + H + ": tt " + std::to_string(Tt.Versions[I]) + ", LibTorch " +
             std::to_string(Torch.Versions[I]);
    if (Tt.RequiresGrad[I] != Torch.RequiresGrad[I])
      return "requires_grad" + H;
    if (Tt.GradFn[I] != Torch.GradFn[I])
      return "grad_fn" + H;
    if (!closeValues(Tt.Grads[I], Torch.Grads[I]))
      return "grad" + H;
  }
  return Tt.Alias == Torch.Alias ? "" : "storage sharing";
}

template <class Tensor> Observation step(const Op &O, std::vector<Tensor> &Pool) {
  Observation Obs;
  try {
    apply(O, Pool);
  } catch (const std::exception &E) {
    Obs.Threw = true;
    Obs.Error = errorText(E);
  }
  Observation After = observe(Pool);
  After.Threw = Obs.Threw;
  After.Error = Obs.Error;
  return After;
}

// Differences documented in docs/robustness.md ("Known differences"): the op
// and the start of the difference's description.
struct Known {
  OpKind Kind; // NumOps: any op
  const char *Prefix;
};
const Known KnownDifferences[] = {
    // Where a dim has size 1 (or the tensor is empty) a stride is never
    // stepped: LibTorch's choice (TensorIterator's output order, expand's 0)
    // is not reproduced.
    {NumOps, "strides of size-1 dims"},
    // LibTorch's matmul dispatches to mv/mm/bmm after folding and
    // transposing; its errors come from whichever kernel it picked.
    {Matmul, "message"},
    // LibTorch squeezes a 1-D matmul's result in place (squeeze_): version 1.
    {Matmul, "version"},
};

bool isKnown(const Op &O, const std::string &Diff) {
  for (const Known &K : KnownDifferences)
    if ((K.Kind == NumOps || K.Kind == O.Kind) && Diff.rfind(K.Prefix, 0) == 0)
      return true;
  return false;
}

struct Totals {
  unsigned Sequences = 0, Ops = 0, Errors = 0, Unknown = 0, KnownSeen = 0;
};

/// One seed: a leaf of a random shape, then up to Steps ops; stops at the
/// first disagreement (after it the two pools no longer match).
void runSeed(unsigned Seed, unsigned Steps, bool Verbose, Totals &Tot) {
  std::mt19937 R(Seed);
  Shape S;
  for (int I = 0, Rank = 1 + R() % 3; I < Rank; ++I)
    S.push_back(1 + R() % 4);
  bool Grad = R() % 2;
  std::vector<tt::Tensor> A{leaf<tt::Tensor>(S, Grad)};
  std::vector<at::Tensor> B{leaf<at::Tensor>(S, Grad)};
  ++Tot.Sequences;
  for (unsigned I = 0; I < Steps && A.size() < 8; ++I) {
    std::vector<Shape> Shapes;
    for (const tt::Tensor &X : A)
      Shapes.emplace_back(X.sizes().begin(), X.sizes().end());
    Op O = drawOp(R, Shapes);
    Observation X = step(O, A), Y = step(O, B);
    ++Tot.Ops;
    Tot.Errors += Y.Threw;
    if (Verbose)
      std::printf("seed %u step %u: %s%s\n", Seed, I, O.str().c_str(),
                  Y.Threw ? (" -> " + Y.Error.substr(0, Y.Error.find('\n'))).c_str() : "");
    std::string Diff = firstDifference(X, Y);
    if (Diff.empty())
      continue;
    bool IsKnown = isKnown(O, Diff);
    (IsKnown ? Tot.KnownSeen : Tot.Unknown)++;
    std::printf("%s: seed %u step %u: %s: %s\n", IsKnown ? "known" : "DISAGREE", Seed, I,
                O.str().c_str(), Diff.c_str());
    return;
  }
}

} // namespace

int main(int argc, char **argv) {
  unsigned First = 1, Last = 200, Steps = 12;
  bool Verbose = false;
  for (int I = 1; I < argc; ++I) {
    if (std::sscanf(argv[I], "--seeds=%u:%u", &First, &Last) == 2 ||
        std::sscanf(argv[I], "--steps=%u", &Steps) == 1)
      continue;
    if (!std::strcmp(argv[I], "--verbose")) {
      Verbose = true;
      continue;
    }
    std::fprintf(stderr, "tt_diff: unknown argument '%s'\n", argv[I]);
    return 2;
  }
  Totals Tot;
  for (unsigned Seed = First; Seed <= Last; ++Seed)
    runSeed(Seed, Steps, Verbose, Tot);
  std::printf("differential: %u sequences, %u ops (%u threw in LibTorch), %u disagreements, "
              "%u known differences\n",
              Tot.Sequences, Tot.Ops, Tot.Errors, Tot.Unknown, Tot.KnownSeen);
  return Tot.Unknown ? 1 : 0;
}
