"""Compiler logs lose every diagnostic located in a file outside the candidate's sources and the toolkit."""
from __future__ import annotations

from kevin_exp.bench.messages import REMOVED_NOTE, drop_foreign_quotes, trim_compiler_log

ROOTS = ("/usr/include", "/opt/torch/include")

GCC = """main.cpp: In function 'at::Tensor f(at::Tensor)':
main.cpp:3:5: error: 'foo' was not declared in this scope
    3 |     foo();
      |     ^~~
In file included from main.cpp:1:
/etc/secret.txt:1:1: error: 'hunter2' does not name a type
    1 | hunter2 password line
      | ^~~~~~~
In file included from /opt/torch/include/torch/extension.h:3,
                 from main.cpp:2:
/opt/torch/include/torch/x.h:9:1: error: expected ';' before '}' token
compilation terminated."""

NVCC = """cuda.cu(4): error: identifier "bar" is undefined
      bar();
      ^

/home/user/private.h(1): error: this declaration has no storage class or type specifier
  top secret data
  ^

2 errors detected in the compilation of "cuda.cu"."""


def test_foreign_diagnostics_and_their_excerpts_are_replaced_by_a_note() -> None:
    out = drop_foreign_quotes(GCC, ROOTS)
    assert "hunter2" not in out and "/etc/secret.txt" not in out
    assert REMOVED_NOTE in out
    assert "main.cpp:3:5: error: 'foo' was not declared" in out and "    3 |     foo();" in out
    assert "/opt/torch/include/torch/x.h:9:1: error" in out  # the toolkit's headers may be quoted


def test_nvcc_style_locations_are_filtered_too() -> None:
    out = drop_foreign_quotes(NVCC, ROOTS)
    assert "top secret" not in out and "private.h" not in out
    assert 'cuda.cu(4): error: identifier "bar" is undefined' in out and "bar();" in out


def test_relative_paths_that_climb_out_are_foreign() -> None:
    out = drop_foreign_quotes("../../x/y.h:1:1: error: leaked\n    1 | leaked", ROOTS)
    assert "leaked" not in out


def test_trim_compiler_log_filters() -> None:
    assert "hunter2" not in trim_compiler_log(GCC, 2000)
