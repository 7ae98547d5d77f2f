# GoogleTest binaries, run by lit so that one runner counts every suite.
import lit.formats

config.name = "tensor-tidy-unit"
config.test_format = lit.formats.GoogleTest(".", "_tests")
config.test_source_root = config.tt_unit_exec_root
config.test_exec_root = config.tt_unit_exec_root
