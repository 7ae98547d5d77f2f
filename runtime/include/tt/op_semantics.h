// Typed access to tt/ops.def. Header-only and dependency-free on purpose: the
// checks include it without linking the runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tt::semantics {

enum class Storage : std::uint8_t { View, MayAlias, Copy, InPlace, Detach, Fresh, Factory, None };
enum class Layout : std::uint8_t { Contiguous, Same, Permuted, Strided, ViewOfSame, Unknown };
enum class Autograd : std::uint8_t { Differentiable, NotDifferentiable };

struct OpInfo {
  std::string_view name;
  Storage storage;
  Layout layout;
  Autograd autograd;
};

inline constexpr OpInfo kOps[] = {
#define TT_OP(Name, S, L, A) {#Name, Storage::S, Layout::L, Autograd::A},
#include "tt/ops.def"
#undef TT_OP
};

inline constexpr std::size_t kNumOps = sizeof(kOps) / sizeof(kOps[0]);

// LibTorch ops the runtime does not implement: for the analysis only.
inline constexpr OpInfo kLibTorchOps[] = {
#define TT_OP(Name, S, L, A)
#define TT_LIBTORCH_OP(Name, S, L, A) {#Name, Storage::S, Layout::L, Autograd::A},
#include "tt/ops.def"
#undef TT_LIBTORCH_OP
#undef TT_OP
};

// Linear scan: ~200 entries, called on method names the caller already knows
// belong to a tensor type. The runtime's rows first.
constexpr const OpInfo *lookup(std::string_view name) {
  for (const OpInfo &op : kOps)
    if (op.name == name)
      return &op;
  for (const OpInfo &op : kLibTorchOps)
    if (op.name == name)
      return &op;
  return nullptr;
}

// A row of one of ops.def's per-op sections: the op and its value there.
template <typename V> struct NamedRow {
  std::string_view name;
  V value;
};

// The value of `name` in a section's rows; Fallback when it is not listed.
template <typename V, std::size_t N>
constexpr V valueIn(const NamedRow<V> (&rows)[N], std::string_view name, V fallback) {
  for (const NamedRow<V> &r : rows)
    if (r.name == name)
      return r.value;
  return fallback;
}

// What a differentiable op saves for backward (TT_SAVES); Nothing if unlisted.
enum class Saves : std::uint8_t { Nothing, Result, Self, SelfResult, Inputs, Cross, Divisor };

inline constexpr NamedRow<Saves> kSaves[] = {
#define TT_OP(Name, S, L, A)
#define TT_SAVES(Name, What) {#Name, Saves::What},
#include "tt/ops.def"
#undef TT_SAVES
#undef TT_OP
};

// Whether the op saves its result for backward.
constexpr bool savesResult(Saves s) { return s == Saves::Result || s == Saves::SelfResult; }
constexpr Saves savesOf(std::string_view name) { return valueIn(kSaves, name, Saves::Nothing); }

// What the in-place op `name_` saves: its result when the out-of-place op's
// backward reads its result (exp_, relu_, sigmoid_, tanh_, sqrt_: the
// written tensor itself); nothing a later write can reach otherwise (the
// original self is gone). scripts/check_op_table.py checks both against PyTorch.
constexpr Saves savesOfInPlace(std::string_view name) {
  if (name.size() < 2 || name.back() != '_')
    return Saves::Nothing;
  const Saves base = savesOf(name.substr(0, name.size() - 1));
  return savesResult(base) ? Saves::Result : Saves::Nothing;
}

// Whether the op saves its tensor argument `index` (0: self, 1: the other)
// for backward, given which arguments require grad.
constexpr bool savesInput(Saves s, int index, bool selfRequiresGrad, bool otherRequiresGrad) {
  switch (s) {
  case Saves::Self:
  case Saves::SelfResult:
    return index == 0;
  case Saves::Inputs:
    return index <= 1;
  case Saves::Cross:
    return index == 0 ? otherRequiresGrad : index == 1 && selfRequiresGrad;
  case Saves::Divisor:
    return index == 0 ? otherRequiresGrad : index == 1;
  default:
    return false;
  }
}

// Ops ops.def lists as not implemented in tt (TT_UNSUPPORTED).
struct UnsupportedOp {
  std::string_view name, why;
};
inline constexpr UnsupportedOp kUnsupported[] = {
#define TT_OP(Name, S, L, A)
#define TT_UNSUPPORTED(Name, Why) {#Name, Why},
#include "tt/ops.def"
#undef TT_UNSUPPORTED
#undef TT_OP
    {"", ""}, // the list may be empty
};

constexpr bool isUnsupported(std::string_view name) {
  for (const UnsupportedOp &op : kUnsupported)
    if (!op.name.empty() && op.name == name)
      return true;
  return false;
}

// In-place ops PyTorch does not reject on an expanded tensor (a stride-0
// dimension of size > 1): TT_EXPANDED_WRITE rows. Every other in-place op raises.
enum class ExpandedWrite : std::uint8_t { Raises, Accepted, Deprecated };
inline constexpr NamedRow<ExpandedWrite> kExpandedWrites[] = {
#define TT_OP(Name, S, L, A)
#define TT_EXPANDED_WRITE(Name, V) {#Name, ExpandedWrite::V},
#include "tt/ops.def"
#undef TT_EXPANDED_WRITE
#undef TT_OP
};

constexpr ExpandedWrite expandedWrite(std::string_view name) {
  return valueIn(kExpandedWrites, name, ExpandedWrite::Raises);
}

// The result dtype rule of ops.def's TT_RESULT_DTYPE section; Self for ops
// not listed (self's dtype when every tensor operand has it).
enum class ResultDType : std::uint8_t { Self, Bool, Long, Floating, Own, Values };
inline constexpr NamedRow<ResultDType> kResultDTypes[] = {
#define TT_OP(Name, S, L, A)
#define TT_RESULT_DTYPE(Name, Rule) {#Name, ResultDType::Rule},
#include "tt/ops.def"
#undef TT_RESULT_DTYPE
#undef TT_OP
};

constexpr ResultDType resultDType(std::string_view name) {
  return valueIn(kResultDTypes, name, ResultDType::Self);
}

template <std::size_t N>
constexpr bool inList(const std::string_view (&list)[N], std::string_view name) {
  for (std::string_view n : list)
    if (n == name)
      return true;
  return false;
}

// ops.def's TT_VALUES_INDICES section: ops whose result with a dim is a tuple
// of values (self's dtype) and int64 indices.
inline constexpr std::string_view kValuesIndices[] = {
#define TT_OP(Name, S, L, A)
#define TT_VALUES_INDICES(Name) #Name,
#include "tt/ops.def"
#undef TT_VALUES_INDICES
#undef TT_OP
};

constexpr bool returnsValuesIndices(std::string_view name) {
  return inList(kValuesIndices, name);
}

// ops.def's TT_WHOLE_RESULT section: ops whose result holds whole numbers.
inline constexpr std::string_view kWholeResults[] = {
#define TT_OP(Name, S, L, A)
#define TT_WHOLE_RESULT(Name) #Name,
#include "tt/ops.def"
#undef TT_WHOLE_RESULT
#undef TT_OP
};

constexpr bool wholeResult(std::string_view name) { return inList(kWholeResults, name); }

// ops.def's TT_KEEPS_WHOLE section: whole numbers in, whole numbers out.
inline constexpr std::string_view kKeepsWhole[] = {
#define TT_OP(Name, S, L, A)
#define TT_KEEPS_WHOLE(Name) #Name,
#include "tt/ops.def"
#undef TT_KEEPS_WHOLE
#undef TT_OP
};

constexpr bool keepsWhole(std::string_view name) { return inList(kKeepsWhole, name); }

// ops.def's TT_SCALAR_PROMOTES section: a floating scalar operand makes the
// result floating whatever self's dtype.
inline constexpr std::string_view kScalarPromotes[] = {
#define TT_OP(Name, S, L, A)
#define TT_SCALAR_PROMOTES(Name) #Name,
#include "tt/ops.def"
#undef TT_SCALAR_PROMOTES
#undef TT_OP
};

constexpr bool scalarPromotes(std::string_view name) { return inList(kScalarPromotes, name); }

// Every method whose name ends in '_' (but not "__") writes self in place, by
// the PyTorch naming convention, even when it is not in the table.
constexpr bool isInPlaceName(std::string_view name) {
  if (const OpInfo *op = lookup(name))
    return op->storage == Storage::InPlace;
  return name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_';
}

// ops.def's TT_RESHAPES_SELF section: in-place ops that change self's layout.
inline constexpr std::string_view kReshapesSelf[] = {
#define TT_OP(Name, S, L, A)
#define TT_RESHAPES_SELF(Name) #Name,
#include "tt/ops.def"
#undef TT_RESHAPES_SELF
#undef TT_OP
};

// An in-place op (isInPlaceName) that leaves self's sizes, strides, dtype and
// device as they were: all but TT_RESHAPES_SELF.
constexpr bool inPlaceKeepsLayout(std::string_view name) {
  return isInPlaceName(name) && !inList(kReshapesSelf, name);
}

// ops.def's TT_MODULE section: LibTorch's torch::nn library modules.
enum class ModuleWeights : std::uint8_t { Weights, NoWeights };
enum class ModuleSaves : std::uint8_t { Input, Result, InputResult, Nothing };
enum class ModuleShape : std::uint8_t { Same, Linear, Embedding, Conv, Pool, Other };
enum class ModuleLayout : std::uint8_t { Contiguous, AsInput, Unknown };

struct ModuleInfo {
  std::string_view name;
  ModuleWeights weights;
  ModuleSaves saves;
  ModuleShape shape;   // of the output
  ModuleLayout layout; // of the output
  int dims;            // spatial dims of Conv and Pool
  constexpr bool holdsWeights() const { return weights == ModuleWeights::Weights; }
  constexpr bool savesInput() const {
    return saves == ModuleSaves::Input || saves == ModuleSaves::InputResult;
  }
  constexpr bool savesResult() const {
    return saves == ModuleSaves::Result || saves == ModuleSaves::InputResult;
  }
};

inline constexpr ModuleInfo kModules[] = {
#define TT_OP(Name, S, L, A)
#define TT_MODULE(Name, W, S, Sh, L, D)                                                           \
  {#Name, ModuleWeights::W, ModuleSaves::S, ModuleShape::Sh, ModuleLayout::L, D},
#include "tt/ops.def"
#undef TT_MODULE
#undef TT_OP
};

// The row of library module `name` ("Linear", "Conv2d"); nullptr if unlisted.
constexpr const ModuleInfo *lookupModule(std::string_view name) {
  for (const ModuleInfo &m : kModules)
    if (m.name == name)
      return &m;
  return nullptr;
}

constexpr std::string_view toString(Storage s) {
  switch (s) {
  case Storage::View: return "view";
  case Storage::MayAlias: return "may-alias";
  case Storage::Copy: return "copy";
  case Storage::InPlace: return "in-place";
  case Storage::Detach: return "detach";
  case Storage::Fresh: return "fresh";
  case Storage::Factory: return "factory";
  case Storage::None: return "none";
  }
  return "?";
}

constexpr std::string_view toString(Layout l) {
  switch (l) {
  case Layout::Contiguous: return "contiguous";
  case Layout::Same: return "same";
  case Layout::Permuted: return "permuted";
  case Layout::Strided: return "strided";
  case Layout::ViewOfSame: return "view-of-same";
  case Layout::Unknown: return "unknown";
  }
  return "?";
}

} // namespace tt::semantics
