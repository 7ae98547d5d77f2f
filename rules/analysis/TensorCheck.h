// Base of every tensor-* check: the `TensorTypes` option, the tensor model
// built from it, and C++-only activation.
#pragma once

#include "ClangTidyCheck.h"
#include "analysis/Finding.h"
#include "analysis/TensorModel.h"

namespace clang::tidy::tensor {

class TensorCheck : public ClangTidyCheck {
public:
  TensorCheck(StringRef Name, ClangTidyContext *Context)
      : ClangTidyCheck(Name, Context),
        TensorTypes(Options.get("TensorTypes", TensorModel::DefaultTensorTypes)),
        Model(TensorTypes) {}

  void storeOptions(ClangTidyOptions::OptionMap &Opts) override {
    Options.store(Opts, "TensorTypes", TensorTypes);
  }
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }

protected:
  // Bool options as strings: OptionsView's bool specialisations are not
  // exported in a form GCC-built objects can link against.
  bool boolOption(StringRef Name, bool Default) const {
    return StringRef(Options.get(Name, Default ? "true" : "false")).equals_insensitive("true");
  }
  void storeBool(ClangTidyOptions::OptionMap &Opts, StringRef Name, bool Value) {
    Options.store(Opts, Name, Value ? "true" : "false");
  }

  const std::string TensorTypes;
  const TensorModel Model;
};

} // namespace clang::tidy::tensor
