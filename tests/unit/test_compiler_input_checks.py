"""What reaches a compiler besides the checked sources: spec fields by type and pattern, the final gate on generated
units, type spellings and command lines, and whose fault a failed build is."""
from __future__ import annotations

import pytest

from kevin_exp.bench.build import compiler_input, failures, glue, spec_check
from kevin_exp.bench.build.proc import ProcResult
from kevin_exp.bench.build.user_flags import unsafe_flags
from kevin_exp.bench.checks.native import native_violations
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.rollout.prompts import Attempt, feedback_text

SRC = "torch::Tensor f(torch::Tensor x) { return x; }\ntorch::Tensor g(torch::Tensor x);\n"
CU = "torch::Tensor g(torch::Tensor x) { return x; }\n__global__ void k() {}\n"
MODULE = "kx_0123456789abcdef"


def spec(**kw) -> ExtensionSpec:
    return ExtensionSpec(**{"name": "ext", "cpp_sources": (SRC,), "functions": ("f",), **kw})


@pytest.mark.parametrize("functions", [("f",), ("f", "g")])
def test_names_the_sources_define_are_accepted(functions) -> None:
    assert spec_check.spec_problems(spec(functions=functions, cuda_sources=(CU,))) == []


@pytest.mark.parametrize("name", [
    'f", (system("id"), "f"), "', "f/*", "f); int x = (1", "f\n#define g f", "at::relu", "f ", "", "int", "1f",
    "f" * 200,
])
def test_a_name_to_bind_that_is_not_an_identifier_is_refused(name) -> None:
    problems = spec_check.spec_problems(spec(functions=("f", name)))
    assert problems and "functions" in problems[0], problems


def test_a_name_to_bind_the_sources_do_not_define_is_refused() -> None:
    """`relu` after `using namespace at` would bind torch's own op."""
    problems = spec_check.spec_problems(spec(functions=("f", "relu")))
    assert problems and "not defined" in problems[0]


@pytest.mark.parametrize("name", ['adv\n"name', "a-b", "ext; rm", ""])
def test_a_module_name_that_is_not_an_identifier_is_refused(name) -> None:
    assert spec_check.spec_problems(spec(name=name))


@pytest.mark.parametrize("flag", ["-DOP=relu", "-DNS=impl", "-DX=", "-DX=a+b", "-UKX_NO_PYBIND", "-DKX_NO_PYBIND",
                                  "-DTORCH_EXTENSION_NAME=x", "-D__CUDA_ARCH__=900", "-D_GLIBCXX_DEBUG",
                                  "-Dkx_pyinit=1", "-DC10_MOBILE"])
def test_macros_that_rename_code_or_the_build_s_own_macros_are_refused(flag) -> None:
    assert unsafe_flags(spec(extra_cflags=(flag,))) == [flag]
    assert unsafe_flags(spec(extra_cuda_cflags=(flag,))) == [flag]


@pytest.mark.parametrize("flag", ["-DNDEBUG", "-DBLOCK=256", "-DEPS=1e-5", "-DSCALE=0.5f", "-DMASK=0xff", "-DN=-1",
                                  "-DKX_UNROLL=4", "-UNDEBUG", "-U__CUDA_NO_HALF_OPERATORS__"])
def test_numeric_macros_are_accepted(flag) -> None:
    assert unsafe_flags(spec(extra_cflags=(flag,))) == []


@pytest.mark.parametrize("path", ["/", "/proc/self", "/etc", "/root", "relative/dir", "/usr/local/cuda/../../etc"])
def test_include_paths_outside_the_toolkit_are_refused(path) -> None:
    assert spec_check.include_path_problems((path,)) == [path]


def test_the_native_rules_report_them_whatever_rules_are_switched_off() -> None:
    off = CheckRules(**{f: False for f in CheckRules.__dataclass_fields__})
    violations = native_violations(spec(functions=("f", 'f", x, "')), "cpu", off)
    assert [v.rule for v in violations] == ["build_inputs"]


@pytest.mark.parametrize("payload, why", [
    ({"name": "e", "cpp_sources": [SRC], "functions": [1]}, "functions"),
    ({"name": "e", "cpp_sources": SRC}, "cpp_sources"),
    ({"name": 3, "cpp_sources": [SRC]}, "name"),
    ({"name": "e", "cpp_sources": [SRC], "with_cuda": "yes"}, "with_cuda"),
    ({"name": "e", "cpp_sources": [SRC], "build_directory": "/tmp"}, "fields"),
    ({"cpp_sources": [SRC]}, "name"),
    ([], "object"),
])
def test_a_runner_s_build_request_must_be_a_spec_of_the_right_types(payload, why) -> None:
    answer = spec_check.spec_from_request(payload)
    assert isinstance(answer, str) and why in answer


def test_a_well_formed_build_request_gives_the_spec() -> None:
    answer = spec_check.spec_from_request({"name": "e", "cpp_sources": [SRC], "functions": ["f"], "with_cuda": None})
    assert answer == ExtensionSpec(name="e", cpp_sources=(SRC,), functions=("f",))


def test_the_generated_unit_must_be_the_sources_and_glue_made_of_identifiers(tmp_path) -> None:
    good = spec()
    unit = tmp_path / "main.cpp"
    unit.write_text(glue.cpp_source(good.cpp_sources) + "\n" + glue.split_glue(("f",), MODULE))
    compiler_input.check_unit(unit, good, MODULE)
    unit.write_text(unit.read_text() + "static int x = 1;\n")
    with pytest.raises(compiler_input.Refused):
        compiler_input.check_unit(unit, good, MODULE)
    with pytest.raises(compiler_input.Refused):
        compiler_input.check_names(("f", 'f/*", 1, "*/'), MODULE)
    with pytest.raises(compiler_input.Refused):
        compiler_input.check_names(("f",), "kx_x; evil")


@pytest.mark.parametrize("sig", ["at::Tensor(at::Tensor); static int e = f(); //", 'at::Tensor(at::Tensor) /* " */',
                                 "at::Tensor(at::Tensor)\n#include <x>", "int(int", "at::Tensor{}"])
def test_type_spellings_read_back_from_an_object_must_be_plain_types(sig) -> None:
    with pytest.raises(compiler_input.Refused):
        compiler_input.check_signatures([sig])


@pytest.mark.parametrize("sig", ["at::Tensor(at::Tensor)", "at::Tensor(const at::Tensor&, double, long int)",
                                 "std::tuple<at::Tensor, at::Tensor>(at::Tensor, c10::ArrayRef<long int>)",
                                 "void(float*, const float*, int, ...)", "int (*)(int [3])", glue.NOT_A_FUNCTION])
def test_honest_type_spellings_pass(sig) -> None:
    compiler_input.check_signatures([sig])


def test_a_command_line_holds_only_the_builder_s_arguments_and_allowed_flags() -> None:
    s = spec(extra_cflags=("-O3", "-DBLOCK=4"))
    trusted = {"c++", "-c", "main.cpp", "-o", "main.o"}
    compiler_input.check_argv(["c++", "-O3", "-DBLOCK=4", "-c", "main.cpp", "-o", "main.o"], trusted, s, "g++")
    with pytest.raises(compiler_input.Refused, match="neither"):
        compiler_input.check_argv(["c++", "-O3", "-include", "/etc/x", "-c", "main.cpp"], trusted, s, "g++")
    with pytest.raises(compiler_input.Refused):
        compiler_input.check_argv(["c++", "-DOP=relu"], trusted, spec(extra_cflags=("-DOP=relu",)), "g++")


def _res(output: str, rc: int = 1, timed_out: bool = False) -> ProcResult:
    return ProcResult(["c++", "-c", "main.cpp"], rc, output, 1.0, timed_out)


@pytest.mark.parametrize("output", [
    "main.cpp:3:5: error: expected ';' before '}' token",
    "main.cpp:1:10: fatal error: nothere.h: No such file or directory",
    "cuda.cu(12): error: identifier \"foo\" is undefined",
    "/usr/include/c++/13/bits/stl_vector.h:10:3: error: no matching function\nmain.cpp:7:12:   required from here",
    "/usr/bin/ld: main.o: in function `f':\nmain.cpp:(.text+0x1a): undefined reference to `h(at::Tensor)'",
])
def test_diagnostics_in_the_candidate_s_files_are_its_compile_error(output) -> None:
    assert failures.classify(_res(output)) == failures.SOURCE


@pytest.mark.parametrize("result", [
    _res("", rc=-9), _res("main.cpp:3:5: error: x", timed_out=True),
    _res("c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated."),
    _res("cc1plus: out of memory allocating 65536 bytes"),
    _res("cannot run /nonexistent/c++: [Errno 2] No such file or directory", rc=127),
    _res("c++: fatal error: cannot execute 'cc1plus': execvp: No such file or directory"),
    _res("/usr/bin/ld: cannot find crti.o: No such file or directory\ncollect2: error: ld returned 1 exit status"),
    _res("kx-jail: mount failed: Operation not permitted"),
])
def test_failures_of_the_machine_are_not_the_candidate_s(result) -> None:
    assert failures.classify(result) == failures.INFRA


def test_diagnostics_drop_command_lines() -> None:
    out = failures.diagnostics("$ /usr/bin/c++ -isystem /x -c main.cpp\nmain.cpp:1:1: error: x\n/usr/bin/c++ -O2 -c y")
    assert out == "main.cpp:1:1: error: x"


def test_an_infra_failure_is_not_fed_back_as_the_model_s_mistake() -> None:
    text = feedback_text(Attempt("code", "", "infra_error", "$ /usr/bin/c++ -isystem /secret/path -c main.cpp"))
    assert "evaluator failed" in text and "/secret/path" not in text and "failed to compile" not in text
