"""The ATen op watch: a small trusted C++ library (loaded with ctypes) that sees ATen ops on every thread.

``block_torch_compute()`` is a ``TorchDispatchMode``, which is thread-local: an op a candidate's C++ runs
on another thread (``#pragma omp parallel`` calling ``at::mm``, ``at::parallel_for``) never reaches it. While
armed, the watch's global ``RecordFunction`` callback records every operator call made on any thread other
than the arming one whose name is not allow-listed; composite ops (``aten::matmul``, ``aten::reshape``) are
skipped, as the dispatch mode never sees them either: what they decompose into is recorded.

Built once per torch and source version into the build cache (``<cache>/opwatch/<key>/kx_op_watch.so``,
about 10-20 s of g++) by the evaluator's ``Builder``; a worker finds it in the read-only cache it is given.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from . import cache, proc

LIBRARY = "kx_op_watch.so"
SOURCE = r"""
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {
std::mutex mu;
std::unordered_set<std::string> allowed;
std::unordered_map<std::string, bool> composite_cache;
std::vector<std::string> seen;
std::atomic<long> hits{0};
std::thread::id owner;
at::CallbackHandle handle = 0;
bool installed = false;

bool is_composite(const at::RecordFunction& fn) {
  auto name = fn.operator_name();
  if (!name) return true;  // not an operator (a scope): nothing to judge
  auto op = c10::Dispatcher::singleton().findOp(*name);
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (std::this_thread::get_id() == owner) return nullptr;  // the dispatch mode's thread
  std::string name = fn.name();
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  std::lock_guard<std::mutex> lock(mu);
  if (allowed.count(name)) return nullptr;
  auto it = composite_cache.find(name);
  bool composite = it != composite_cache.end() ? it->second : (composite_cache[name] = is_composite(fn));
  if (composite) return nullptr;
  hits++;
  if (seen.size() < 32) seen.push_back(name);
  return nullptr;
}
}  // namespace

extern "C" int kx_watch_arm(const char* allowed_names) {
  std::lock_guard<std::mutex> lock(mu);
  if (installed) return -1;
  allowed.clear();
  std::string all(allowed_names), cur;
  for (char c : all) {
    if (c == '\n') { if (!cur.empty()) allowed.insert(cur); cur.clear(); } else cur += c;
  }
  if (!cur.empty()) allowed.insert(cur);
  seen.clear();
  hits = 0;
  owner = std::this_thread::get_id();
  handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start).scopes({at::RecordScope::FUNCTION}));
  installed = true;
  return 0;
}

// Names recorded (newline-separated, into buf); returns how many ops were recorded, or -1 if the callback
// had been removed behind the watch's back.
extern "C" long kx_watch_disarm(char* buf, long buflen) {
  bool intact = at::hasGlobalCallbacks();
  if (installed) at::removeCallback(handle);
  std::lock_guard<std::mutex> lock(mu);
  installed = false;
  std::string out;
  for (auto& s : seen) out += s + "\n";
  if (buflen > 0) {
    std::strncpy(buf, out.c_str(), buflen - 1);
    buf[buflen - 1] = 0;
  }
  return intact ? hits.load() : -1;
}
"""


def key() -> str:
    import torch

    return cache.digest(["opwatch-1", SOURCE, torch.__version__, torch.compiled_with_cxx11_abi(), sys.version_info[:2]])


def library_in(cache_root: Path | str) -> Path:
    return cache.entry_dir(Path(cache_root), "opwatch", key()) / LIBRARY


def build(cache_root: Path, timeout_s: float = 300.0, memory_limit_gb: float = 8.0) -> tuple[Path | None, str]:
    """The library in ``cache_root`` (built now if missing, once across processes) and what happened."""
    import time

    from .flags import torch_flags

    final = cache.entry_dir(Path(cache_root), "opwatch", key())
    if (final / LIBRARY).exists():
        return final / LIBRARY, "cached"
    with cache.locked(cache.lock_path(final)):
        if (final / LIBRARY).exists():
            return final / LIBRARY, "cached"
        tmp = cache.new_tmp_dir(final)
        (tmp / "kx_op_watch.cpp").write_text(SOURCE)
        tf = torch_flags()
        import torch

        abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
        include = Path(torch.__file__).parent / "include"
        argv = [tf.cxx, "-O2", tf.std, "-fPIC", "-shared", abi, "-isystem", str(include), "kx_op_watch.cpp",
                f"-L{tf.torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{tf.torch_lib}", "-o", LIBRARY]
        res = proc.run(argv, tmp, time.monotonic() + timeout_s, memory_limit_gb)
        if not res.ok:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            return None, f"the op watch did not build: {res.output[-500:]}"
        # the workers' uids load it through their read-only view of the cache
        for path in (tmp, tmp / LIBRARY):
            os.chmod(path, 0o755)
        for folder in (Path(cache_root), final.parent):
            os.chmod(folder, os.stat(folder).st_mode | 0o005)
        cache.publish(tmp, final)
        return final / LIBRARY, f"built in {res.seconds:.1f} s"
