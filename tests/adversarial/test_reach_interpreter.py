"""Class 1: reaching the evaluator's objects from the candidate's own process, from pure Python (frames, the
builtins, ``nn.init``'s ``torch`` attribute, classes built with ``type``) and from native code (pybind11 under
an alias, the CPython API under an assembler label, a token pasted with a digraph), then using them: reading
the reference's output, signing a forged result, faking the comparison, slowing the reference."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import HONEST_KERNEL, Attack, candidate, judge, stopped

# A running generator's own frame leads back to its caller's, and from there to every frame of the worker.
CALLER_FRAME = '''

def _caller_frame():
    box = []

    def peek():
        yield box[0].gi_frame.f_back

    gen = peek()
    box.append(gen)
    return next(gen)
'''

ONE = "\n_one = torch.zeros(1)\n"

STEAL_REFERENCE = candidate(prelude=CALLER_FRAME + ONE + '''

def _reference_output():
    frame = _caller_frame()
    while frame is not None:
        seen = frame.f_locals
        if "ref_outputs" in seen and "k" in seen:
            return seen["ref_outputs"][seen["k"]]
        if "ref_out" in seen:
            return seen["ref_out"]
        frame = frame.f_back
    return None
''', forward='''
ext.leaky(_one)
stolen = _reference_output()
if stolen is None:
    return ext.leaky(x)
return stolen
''')

FORGE_SIGNED_RESULT = candidate(prelude=CALLER_FRAME + '''

def _sign_and_leave():
    frame = _caller_frame()
    while frame is not None:
        seen = frame.f_locals
        if "key" in seen and "result_pipe" in seen:
            world = frame.f_globals
            fast = {"median_ms": 0.001, "mean_ms": 0.001, "std_ms": 0.0, "min_ms": 0.001, "max_ms": 0.001,
                    "p25_ms": 0.001, "p75_ms": 0.001, "trials": 12}
            slow = dict(fast, median_ms=1.0, mean_ms=1.0, min_ms=1.0, max_ms=1.0, p25_ms=1.0, p75_ms=1.0)
            result = {"status": "ok", "device": "cpu", "runtime_stats": fast, "ref_runtime_stats": slow}
            signed = world["sign_result"](seen["key"], world["json"].dumps(result).encode())
            pipe = seen["result_pipe"]
            pipe.write(signed.decode())
            pipe.flush()
            pipe.close()
            world["os"]._exit(0)
        frame = frame.f_back
''', forward='''
_sign_and_leave()
return ext.leaky(x)
''')

# nn.init imports torch: through it, the whole public torch API, including global module hooks, which also
# run around the reference's forward.
GLOBAL_HOOK_SLOWS_REFERENCE = candidate(prelude='''
_module_hooks = nn.init.torch.nn.modules.module


def _slow_reference(module, args):
    if isinstance(module, ModelNew):
        return None
    spins = 0
    while spins < 200000:
        spins += 1
    return None


_module_hooks.register_module_forward_pre_hook(_slow_reference)
''')

# A TorchFunctionMode built with type() (the special method's name assembled at run time), kept entered by a
# suspended generator: every torch.allclose, the evaluator's included, answers True.
FUNCTION_MODE_FAKES_COMPARISON = candidate(prelude=ONE + '''
_T = nn.init.torch
_dunder = "_" * 2


def _answer(mode, func, types, args=(), kwargs=None):
    if func is _T.allclose:
        return True
    return func(*args, **(kwargs or {}))


_Mode = type("Quiet", (_T.overrides.TorchFunctionMode,), {_dunder + "torch_function" + _dunder: _answer})


def _hold(mode):
    with mode:
        yield mode


_keeper = _hold(_Mode())
next(_keeper)
''', forward='''
ext.leaky(_one)
return torch.zeros_like(x)
''')

# The builtins dict of any frame holds __import__: gc, then the reference model, then a hook on it.
BUILTINS_IMPORT_SLOWS_REFERENCE = candidate(prelude=CALLER_FRAME + '''
_hooked = []


def _slow(module, args):
    spins = 0
    while spins < 200000:
        spins += 1
    return None


def _hook_reference():
    importer = _caller_frame().f_builtins["_" * 2 + "import" + "_" * 2]
    for obj in importer("gc").get_objects():
        if type(obj).__name__ == "Model":
            obj.register_forward_pre_hook(_slow)
            _hooked.append(obj)
''', forward='''
if not _hooked:
    _hook_reference()
return ext.leaky(x)
''')

PYBIND_ALIAS_REPLACES_COMPARISON = candidate(r'''
namespace p = pybind11;

static const char* kPatch = R"PY(
import types
import kevin_exp.bench.worker.evaluation as evaluation
import kevin_exp.bench.worker.timing as timing
fine = lambda *a, **k: types.SimpleNamespace(ok=True, reason="", max_abs_diff=0.0)
evaluation.compare_outputs = fine
timing.compare_outputs = fine
evaluation.same_values = lambda *a, **k: True
)PY";

static bool patched = false;

torch::Tensor leaky(torch::Tensor x) {
    if (!patched) {
        patched = true;
        p::dict scope;
        p::getattr(p::module_::import("builtins"), "exec")(p::str(kPatch), scope);
    }
    return torch::empty_like(x);
}
''', name="adv_pybind_alias")

ASM_LABEL_CAPI_SLOWS_REFERENCE = candidate(HONEST_KERNEL.replace("torch::Tensor leaky(torch::Tensor x) {", r'''
extern "C" int kx_run_python(const char*, void*) __asm__("PyRun_SimpleStringFlags");

static const char* kSlow = R"PY(
import time, torch
_relu = torch.relu
def _slow_relu(*a, **k):
    time.sleep(0.004)
    return _relu(*a, **k)
torch.relu = _slow_relu
)PY";

static bool slowed = false;

torch::Tensor leaky(torch::Tensor x) {
    if (!slowed) { slowed = true; kx_run_python(kSlow, nullptr); }'''), name="adv_asm_label")

DIGRAPH_REGISTERS_ATEN_KERNEL = candidate(HONEST_KERNEL + r'''
#include <torch/library.h>
#define KX_JOIN(a, b) a %:%: b

static at::Tensor slow_relu(const at::Tensor& x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    volatile double sink = 0;
    for (int i = 0; i < 4000000; ++i) sink = sink + i;
    return out;
}

KX_JOIN(TORCH_LIB, RARY_IMPL)(aten, CPU, m) { m.impl("relu", slow_relu); }
''', name="adv_digraph_aten")

ATTACKS = [
    Attack("frame_walk_steals_reference_output", STEAL_REFERENCE, stopped("forbidden", "incorrect"),
           needs=("static", "oracle")),
    Attack("frame_walk_signs_forged_result", FORGE_SIGNED_RESULT, stopped("forbidden", "runtime_error", "crashed", "suspect"),
           needs=("static", "oracle")),
    Attack("nn_init_torch_global_hook_slows_reference", GLOBAL_HOOK_SLOWS_REFERENCE, stopped("forbidden", "suspect"),
           gain=True, needs=("static", "oracle")),
    Attack("type_built_function_mode_fakes_allclose", FUNCTION_MODE_FAKES_COMPARISON, stopped("forbidden", "incorrect"),
           needs=("static", "oracle")),
    Attack("frame_builtins_import_gc_hooks_reference", BUILTINS_IMPORT_SLOWS_REFERENCE,
           stopped("forbidden", "suspect", "runtime_error"), gain=True, needs=("static", "oracle")),
    Attack("pybind11_alias_replaces_comparison", PYBIND_ALIAS_REPLACES_COMPARISON,
           stopped("forbidden", "incorrect", "runtime_error", "crashed"), needs=("static", "oracle")),
    Attack("asm_label_python_capi_slows_reference", ASM_LABEL_CAPI_SLOWS_REFERENCE,
           stopped("forbidden", "suspect", "runtime_error", "crashed"), gain=True, needs=("static", "oracle")),
    Attack("digraph_paste_registers_aten_relu", DIGRAPH_REGISTERS_ATEN_KERNEL,
           stopped("forbidden", "suspect", "runtime_error", "crashed", "compile_error"), gain=True,
           needs=("static", "oracle")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
