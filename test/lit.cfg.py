# lit configuration for the checks, the driver and the runtime's end-to-end tests.
import os
import shutil
import subprocess

import lit.formats

config.name = "tensor-tidy"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".cpp", ".test"]
config.excludes = ["Inputs", "unit", "lit", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.tt_obj_root, "test")

config.environment["PATH"] = os.pathsep.join(
    [config.tt_bin_dir, config.llvm_bin_dir, config.environment.get("PATH", "")])
for var in ("TT_TRACE", "CUDA_VISIBLE_DEVICES", "HOME"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

module = os.path.join(config.tt_lib_dir, "TensorTidyModule.so")
# A sanitized build (-DTT_SANITIZE=ON, scripts/sanitize-check.sh): programs
# linked against the runtime need the sanitizer too, and stock clang-tidy-19
# (not sanitized) loads the sanitized module only with ASan's runtime
# preloaded. clang leaves its AST unfreed on purpose: no leak checks there.
sanitize = getattr(config, "sanitize", False)
link_sanitizer = " -fsanitize=address,undefined" if sanitize else ""
clang_tidy = "clang-tidy-19"
if sanitize:
    asan_rt = subprocess.run(["clang++-19", "-print-file-name=libclang_rt.asan-x86_64.so"],
                             capture_output=True, text=True).stdout.strip()
    clang_tidy = "env LD_PRELOAD=%s ASAN_OPTIONS=detect_leaks=0 clang-tidy-19" % asan_rt
    config.available_features.add("sanitize")
    config.name = "tensor-tidy-sanitized"  # apart from the same tests in the plain build
    config.environment["UBSAN_OPTIONS"] = "print_stacktrace=1"
tt_include = "-I" + os.path.join(config.tt_src_root, "runtime", "include")
checker = os.path.join(config.tt_src_root, "test", "lit", "check_tensor_tidy.py")
# <torch/torch.h> precompiled (test/CMakeLists.txt) where this build made it:
# the sanitizer build (scripts/sanitize-check.sh) builds only the tools.
torch_pch = config.torch_include_flags
if os.path.exists(os.path.join(config.tt_obj_root, "test", "torch.pch")):
    torch_pch = config.torch_pch_flags

config.substitutions += [
    ("%tensor_tidy", os.path.join(config.tt_bin_dir, "tensor-tidy")),
    ("%tensor_clangd", os.path.join(config.tt_bin_dir, "tensor-clangd")),
    ("%clang_tidy_plugin", clang_tidy + " --load=" + module),
    ("%clang_tidy", clang_tidy),
    ("%tt_module", module),
    ("%tt_include", tt_include),
    ("%tt_lib", "-L%s -Wl,-rpath,%s -ltt_runtime%s" % (config.tt_lib_dir, config.tt_lib_dir,
                                                       link_sanitizer)),
    ("%torch_pch", torch_pch),
    ("%torch_include", config.torch_include_flags),
    ("%clangxx", "clang++-19"),
    ("%python", config.python),
    ("%tt_src", config.tt_src_root),
    ("%{tt_obj_root}", config.tt_obj_root),
    ("%check_tensor_tidy", "%s %s --tensor-tidy=%s --module=%s --tt-include=%s --clang-tidy='%s'" % (
        config.python, checker, os.path.join(config.tt_bin_dir, "tensor-tidy"), module,
        os.path.join(config.tt_src_root, "runtime", "include"), clang_tidy)),
]

if config.have_tidy:
    config.available_features.add("tidy")
if getattr(config, "have_clangd", False):
    config.available_features.add("tensor-clangd")
if shutil.which("nvim"):
    config.available_features.add("nvim")
if getattr(config, "have_trace", True):
    config.available_features.add("tt-trace")
if config.torch_include_flags:
    config.available_features.add("torch")
if getattr(config, "have_libtorch", False):
    config.available_features.add("libtorch")
if config.have_cuda_build:
    config.available_features.add("cuda-build")
try:
    if shutil.which("nvidia-smi") and subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0:
        config.available_features.add("cuda-gpu")
except (OSError, subprocess.SubprocessError):
    pass
# Debian's PyTorch, the oracle of the conformance golden file.
try:
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                      capture_output=True, timeout=120).returncode == 0:
        config.available_features.add("torch-python")
except (OSError, subprocess.SubprocessError):
    pass
