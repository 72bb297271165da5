"""Paths with spaces survive every place a command line is read back from text (issue 32): torch's flags, nvcc's
dry run, g++'s dependency lists; and a build that fails because torch is out of the compiler's sight is the
machine's failure, reported with the tool's own complaint."""
from __future__ import annotations

import pytest
import torch.utils.cpp_extension as ce

from kevin_exp.bench.build import failures, flags, lean, nvcc_pipe
from kevin_exp.bench.build.builder import _first_error
from kevin_exp.bench.build.proc import ProcResult

TORCH = "/home/me/my project/.venv/lib/python3.11/site-packages/torch"


def test_torch_s_flags_keep_a_torch_folder_with_spaces_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ce, "_TORCH_PATH", TORCH)
    monkeypatch.setattr(ce, "TORCH_LIB_PATH", f"{TORCH}/lib")
    cflags, ldflags = flags._probe_ninja(ce)
    assert f"{TORCH}/include" in cflags, cflags
    assert ldflags[:2] == ["-shared", f"-L{TORCH}/lib"] and "-lc10" in ldflags, ldflags


# the shape of nvcc 13's `--dryrun` (its trailing blanks included) for a CUDA home "/opt/my  cuda"
DRYRUN = (
    "#$ _SPACE_= \n"
    "#$ CICC_PATH=/opt/my  cuda/bin/../nvvm/bin\n"
    "#$ PATH=/opt/my  cuda/bin/../nvvm/bin:/opt/my  cuda/bin:/usr/bin\n"
    '#$ INCLUDES="-I/opt/my  cuda/bin/../targets/x86_64-linux/include"  \n'
    '#$ gcc -E -x c++ -I"/src dir/inc" "-I/opt/my  cuda/bin/../targets/x86_64-linux/include" "k.cu" -o "/tmp/a.ii"\n'
    '#$ "$CICC_PATH/cicc" --orig_src_path_name "/src dir/k.cu" "/tmp/a.ii" -o "/tmp/a.ptx"\n'
)


def test_nvcc_s_dry_run_keeps_paths_with_spaces_as_they_are() -> None:
    parsed = nvcc_pipe.parse_dryrun(DRYRUN, {})
    assert parsed is not None
    env, cmds = parsed
    assert env["CICC_PATH"] == "/opt/my  cuda/bin/../nvvm/bin" and env["PATH"].startswith("/opt/my  cuda/bin/")
    assert env["INCLUDES"] == "-I/opt/my  cuda/bin/../targets/x86_64-linux/include" and env["_SPACE_"] == ""
    assert cmds[0][4:6] == ["-I/src dir/inc", "-I/opt/my  cuda/bin/../targets/x86_64-linux/include"]
    assert cmds[1][:3] == ["/opt/my  cuda/bin/../nvvm/bin/cicc", "--orig_src_path_name", "/src dir/k.cu"]


def test_a_dependency_list_with_escaped_spaces_is_read_path_by_path() -> None:
    deps = ("probe.o: probe.cpp /my\\ venv/torch/include/torch/extension.h \\\n"
            " /usr/include/c++/13/vector /my\\ venv/torch/include/c++/x/not_std.h\\ x /usr/include/c++/13/cmath\n")
    assert lean._dep_paths(deps)[2] == "/my venv/torch/include/torch/extension.h"
    assert lean._std_headers(deps) == ["cmath", "vector"]


def _res(output: str) -> ProcResult:
    return ProcResult(["c++"], 1, output, 1.0)


@pytest.mark.parametrize("output", [
    "main.cpp:1:10: fatal error: torch/extension.h: No such file or directory\ncompilation terminated.",
    "cuda.cu:3:10: fatal error: cuda_runtime.h: No such file or directory\ncompilation terminated.",
])
def test_torch_s_or_cuda_s_own_headers_out_of_sight_are_the_machine_s(output: str) -> None:
    assert failures.classify(_res(output)) == failures.INFRA


def test_a_header_the_candidate_names_that_is_missing_is_its_own() -> None:
    output = "main.cpp:7:10: fatal error: cuda_runtime.h: No such file or directory\ncompilation terminated."
    assert failures.classify(_res(output)) == failures.SOURCE


def test_a_failed_link_is_summed_up_by_ld_s_own_complaint() -> None:
    output = ("/usr/bin/ld: cannot find /home/me/my: No such file or directory\n"
              "collect2: error: ld returned 1 exit status\n")
    assert _first_error(output) == "/usr/bin/ld: cannot find /home/me/my: No such file or directory"
    assert failures.classify(_res(output)) == failures.INFRA
