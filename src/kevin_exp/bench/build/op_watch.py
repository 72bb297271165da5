"""The ATen op watch: a small trusted C++ library (loaded with ctypes) that sees ATen ops on every thread.

``block_torch_compute()`` is a ``TorchDispatchMode``, which is thread-local: an op a candidate's C++ runs
on another thread (``#pragma omp parallel`` calling ``at::mm``, ``at::parallel_for``) never reaches it. While
armed, the watch's global ``RecordFunction`` callback records every operator call made on any thread other
than the arming one whose name is not allow-listed; composite ops (``aten::matmul``, ``aten::reshape``) are
skipped, as the dispatch mode never sees them either: what they decompose into is recorded.

The watch depends on state in the process that candidate code can change: RecordFunction can be switched off per
thread (``at::enableRecordFunction(false)``, a ``RecordFunctionGuard``) and callbacks removed. ``kx_watch_verify``
checks it after every guarded call on every thread torch's intra-op work runs on: the OpenMP team at its full
size (the candidate's ``#pragma omp parallel`` and ``at::parallel_for`` run on the same threads), each thread
running a probe record function that must reach the watch's callback. It must be the OpenMP runtime torch
uses (checked: the same ``GOMP_parallel``).

The library also holds the runner's SIGSYS handler (``kx_sigsys_report``, see ``seccomp.py``): it writes the
name of a refused system call to stderr, then ends the process with exit status 128 + SIGSYS.

Built once per torch and source version into the build cache (``<cache>/opwatch/<key>/kx_op_watch.so``,
about 10-20 s of g++) by the evaluator's ``Builder``; a worker finds it in the read-only cache it is given.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from . import cache, proc
from .flags import torch_flags

LIBRARY = "kx_op_watch.so"
SOURCE = r"""
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <atomic>
#include <csignal>
#include <dlfcn.h>
#include <ucontext.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
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
const char kProbe[] = "kx::op_watch_probe";
thread_local bool probe_seen = false;

bool is_composite(const at::RecordFunction& fn) {
  auto name = fn.operator_name();
  if (!name) return true;  // not an operator (a scope): nothing to judge
  auto op = c10::Dispatcher::singleton().findOp(*name);
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (std::strcmp(fn.name(), kProbe) == 0) { probe_seen = true; return nullptr; }
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

// Every thread of the OpenMP team (at its full size): record functions on, and a probe reaches the watch's
// callback. Returns how many threads failed (their numbers and what failed go to buf), -2 if the watch is not
// armed, -3 if this library's OpenMP runtime is not the one torch's intra-op work runs on.
extern "C" long kx_watch_verify(char* buf, long buflen) {
  if (!installed) return -2;
  void* torch_lib = dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY);
  void* theirs = torch_lib ? dlsym(torch_lib, "GOMP_parallel") : nullptr;
  if (theirs && theirs != reinterpret_cast<void*>(&GOMP_parallel)) return -3;
  const int team = omp_get_max_threads();
  std::atomic<long> failed{0};
  std::vector<int> state(team > 0 ? team : 1, 0);
  #pragma omp parallel num_threads(team)
  {
    int tid = omp_get_thread_num();
    int bad = at::isRecordFunctionEnabled() ? 0 : 1;
    probe_seen = false;
    {
      at::RecordFunction probe(at::RecordScope::FUNCTION);
      if (probe.isActive()) probe.before(kProbe);
    }
    if (!probe_seen) bad |= 2;
    if (bad) { failed++; if (tid < (int)state.size()) state[tid] = bad; }
  }
  std::string out;
  for (size_t t = 0; t < state.size(); ++t) {
    if (!state[t]) continue;
    out += "thread " + std::to_string(t) + ": " +
           (state[t] & 1 ? "record functions switched off" : "the watch's callback is not reached") + "\n";
  }
  if (buflen > 0) {
    std::strncpy(buf, out.c_str(), buflen - 1);
    buf[buflen - 1] = 0;
  }
  return failed.load();
}

namespace {
typedef const char* (*dump_fn)(int, void*, void*);
dump_fn dump_traceback = nullptr;  // CPython's _Py_DumpTracebackThreads, what faulthandler prints
int trap_nrs[64];
char trap_names[64][112];
int trap_count = 0;
char trap_text[400];

void put(char* msg, size_t& n, size_t cap, const char* s) {
  while (*s && n + 1 < cap) msg[n++] = *s++;
}

// The new action of a refused rt_sigaction, if it is SIG_DFL: a fatal signal's handler (Python's faulthandler,
// after printing its traceback) putting the default action back before it raises the signal again.
bool restores_default(void* context, long* signum) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  *signum = uc->uc_mcontext.gregs[REG_RDI];
  auto act = reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSI]);
#elif defined(__aarch64__)
  *signum = uc->uc_mcontext.regs[0];
  auto act = reinterpret_cast<void* const*>(uc->uc_mcontext.regs[1]);
#else
  void* const* act = nullptr;
#endif
  return act != nullptr && *act == reinterpret_cast<void*>(SIG_DFL) && *signum > 0 && *signum < 65;
}

void on_sigsys(int, siginfo_t* si, void* context) {
  // Only async-signal-safe calls, none of them refused by the filter; the process ends here.
  long signum = 0;
  if (si->si_syscall == SYS_rt_sigaction && restores_default(context, &signum)) {
    // faulthandler restores first and prints after: print its message and traceback here, then end as that
    // signal would have (the parent reads an exit status of 128 + signal as the signal)
    char head[96];
    size_t n = 0;
    put(head, n, sizeof head, "Fatal Python error: ");
    put(head, n, sizeof head, signum == SIGSEGV ? "Segmentation fault" : signum == SIGBUS ? "Bus error" :
        signum == SIGFPE ? "Floating-point exception" : signum == SIGILL ? "Illegal instruction" :
        signum == SIGABRT ? "Aborted" : "fatal signal");
    put(head, n, sizeof head, "\n\n");
    ssize_t w = write(2, head, n);
    (void)w;
    if (dump_traceback) dump_traceback(2, nullptr, nullptr);
    syscall(SYS_exit_group, 128 + signum);
  }
  char msg[640];
  size_t n = 0;
  const char* name = "a refused system call";
  for (int i = 0; i < trap_count; ++i)
    if (trap_nrs[i] == si->si_syscall) name = trap_names[i];
  char num[16];
  int k = 15, v = si->si_syscall < 0 ? 0 : si->si_syscall;
  num[k] = 0;
  do { num[--k] = char('0' + v % 10); v /= 10; } while (v && k > 0);
  put(msg, n, sizeof msg, "\nforbidden system call ");
  put(msg, n, sizeof msg, name);
  put(msg, n, sizeof msg, " [number ");
  put(msg, n, sizeof msg, num + k);
  put(msg, n, sizeof msg, "]: ");
  put(msg, n, sizeof msg, trap_text);
  put(msg, n, sizeof msg, "\n");
  ssize_t w = write(2, msg, n);
  (void)w;
  // exit_group, not a signal raised to itself: the runner is PID 1 of its namespace, which ignores signals it
  // sends itself whose action is the default. The parent reads an exit status of 128 + signal as the signal.
  syscall(SYS_exit_group, 128 + SIGSYS);
}
}  // namespace

// table: lines "number name (why)"; text: said after the name. Installs the SIGSYS handler; 0 on success.
extern "C" int kx_sigsys_report(const char* table, const char* text) {
  trap_count = 0;
  const char* p = table;
  while (*p && trap_count < 64) {
    char* end = nullptr;
    long nr = std::strtol(p, &end, 10);
    if (end == p) break;
    p = end;
    while (*p == ' ') ++p;
    size_t i = 0;
    while (*p && *p != '\n' && i + 1 < sizeof trap_names[0]) trap_names[trap_count][i++] = *p++;
    trap_names[trap_count][i] = 0;
    while (*p && *p != '\n') ++p;
    if (*p == '\n') ++p;
    trap_nrs[trap_count++] = (int)nr;
  }
  std::strncpy(trap_text, text, sizeof trap_text - 1);
  trap_text[sizeof trap_text - 1] = 0;
  dump_traceback = reinterpret_cast<dump_fn>(dlsym(RTLD_DEFAULT, "_Py_DumpTracebackThreads"));
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGSYS, &sa, nullptr);
}
"""


def key() -> str:
    import torch

    return cache.digest(["opwatch-2", SOURCE, torch.__version__, torch.compiled_with_cxx11_abi(), sys.version_info[:2]])


def library_in(cache_root: Path | str) -> Path:
    return cache.entry_dir(Path(cache_root), "opwatch", key()) / LIBRARY


def build(cache_root: Path, timeout_s: float = 300.0, memory_limit_gb: float = 8.0) -> tuple[Path | None, str]:
    """The library in ``cache_root`` (built now if missing, once across processes) and what happened."""
    import time

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
        argv = [tf.cxx, "-O2", tf.std, "-fPIC", "-shared", "-fopenmp", abi, "-isystem", str(include), "kx_op_watch.cpp",
                f"-L{tf.torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{tf.torch_lib}", "-ldl", "-o", LIBRARY]
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
