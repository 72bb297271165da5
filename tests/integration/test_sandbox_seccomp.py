"""A candidate's C++ that starts a thread after forbid_new_tasks() fails with an exception the worker turns
into a runtime error; the process survives. The extension is built with the evaluator's builder."""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kevin_exp.bench.build.builder import Builder
from kevin_exp.bench.spec import ExtensionSpec

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler"),
    pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
                       reason="seccomp filters are defined for Linux on x86_64 and aarch64"),
]

SOURCE = r"""
#include <torch/extension.h>
#include <pthread.h>
#include <cstring>
#include <thread>

at::Tensor with_std_thread(at::Tensor x) {
  auto out = x.clone();
  float* p = out.data_ptr<float>();
  std::thread t([p] { p[0] = 42.f; });
  t.join();
  return out;
}

static void* touch(void* arg) { static_cast<float*>(arg)[0] = 7.f; return nullptr; }

at::Tensor with_pthread(at::Tensor x) {
  auto out = x.clone();
  pthread_t t;
  int rc = pthread_create(&t, nullptr, touch, out.data_ptr<float>());
  TORCH_CHECK(rc == 0, "pthread_create failed: ", std::strerror(rc));
  pthread_join(t, nullptr);
  return out;
}
"""

SCRIPT = r"""
import importlib.machinery, importlib.util, json, sys
import torch
torch.set_num_threads(2)
so, name = sys.argv[1], sys.argv[2]
loader = importlib.machinery.ExtensionFileLoader(name, so)
ext = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, so, loader=loader))
loader.exec_module(ext)
x = torch.zeros(4)
out = {"std_before": ext.with_std_thread(x)[0].item(), "pthread_before": ext.with_pthread(x)[0].item()}
from kevin_exp.bench.seccomp import forbid_new_tasks
forbid_new_tasks()
for fn in ("with_std_thread", "with_pthread"):
    try:
        out[fn] = getattr(ext, fn)(x)[0].item()
    except RuntimeError as exc:
        out[fn] = "RuntimeError: " + str(exc).splitlines()[0]
a = torch.randn(256, 256)
out["mm_after"] = bool(torch.allclose(a @ torch.eye(256), a))
print(json.dumps(out), flush=True)
import os
os._exit(0)  # the interpreter's teardown restores signal handlers, which the filter refuses
"""


def test_threads_started_from_cpp_fail_as_runtime_errors(build_cache: Path, tmp_path: Path) -> None:
    spec = ExtensionSpec(name="spawns_threads", cpp_sources=(SOURCE + f"// {uuid.uuid4().hex}\n",),
                         functions=("with_std_thread", "with_pthread"))
    result = Builder(build_cache).build(spec)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(result.so_path), result.module_name],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["std_before"] == 42.0 and out["pthread_before"] == 7.0  # the code works without the filter
    assert out["with_std_thread"].startswith("RuntimeError") and "not permitted" in out["with_std_thread"], out
    assert out["with_pthread"] == "RuntimeError: pthread_create failed: Operation not permitted", out
    assert out["mm_after"] is True
