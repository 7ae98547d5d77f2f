// The recurrent modules of torch::nn (LSTM, GRU, RNN): which call made an
// output, and how the TU built the module that ran it.
//
// Note [batch_first RNN outputs]: the recurrent modules compute on
// [seq, batch, feature]. With batch_first(true) they transpose the input and
// return output.transpose(0, 1): sizes [B, T, D*H], strides [D*H, B*D*H, 1]
// (LibTorch 1.13, as Python). No two adjacent dims of it merge, so any view to
// fewer dims throws and a reshape to fewer dims copies. The hidden states are
// [L*D, B, H] and contiguous whatever batch_first says.
// torch::nn::utils::rnn::pad_packed_sequence(packed, true) transposes the
// same way.
#pragma once

#include "clang/AST/Expr.h"

#include <optional>

namespace clang::tidy::tensor {

/// The module call (`lstm->forward(x)`, `lstm(x)`) of a recurrent module, or
/// the pad_packed_sequence call, whose output (element 0 of its tuple) E is:
/// `std::get<0>(call)`, the first binding of `auto [out, state] = call`, or
/// `std::get<0>(res)` of a local `res` initialised with the call. Null
/// otherwise.
const CallExpr *rnnOutputCall(const Expr *E);

/// The recurrent module's kind ("LSTM", "GRU", "RNN") a call of
/// rnnOutputCall runs, or "pad_packed_sequence".
llvm::StringRef rnnKind(const CallExpr *RnnCall);

/// Whether the module RnnCall runs was built with batch_first(true), as every
/// construction of it the TU shows says (its member's in-class initialiser,
/// constructor initialisers and assignments in the class's methods; a local's
/// initialiser and assignments). nullopt when the TU does not tell: no
/// construction seen, options from a parameter, a flag that is not a literal.
/// For pad_packed_sequence: its batch_first argument, if constant.
std::optional<bool> rnnBatchFirst(const CallExpr *RnnCall);

} // namespace clang::tidy::tensor
