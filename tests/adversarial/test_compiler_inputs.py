"""Code that reaches the compiler through text the native rules never read: the names to bind (pasted into the
generated binding glue), specs only known at run time, and ``-D`` macros that rename what the rules read.
Every attack here runs torch's own ops behind a decoy kernel with the op guard switched off (the Python
dispatch keys excluded for the call), which the native rules refuse when it is written in the sources."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import HONEST_KERNEL, Attack, candidate, judge, stopped

# The decoy: the bound kernel only forwards to a function pointer the sources never set.
DECOY = r"""
torch::Tensor (*kx_impl)(const torch::Tensor&) = nullptr;

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    return kx_impl(xc);
}
"""
# What the glue runs when the module is imported: the pointer is set to torch's ops with the guard's dispatch
# keys excluded. In a code position of the glue the text between /* and */ is a comment; in a string position
# (the names array) it closes the string, adds this expression, and opens another.
_SET_IMPL = ('[]{ kx_impl = [](const torch::Tensor& x) -> torch::Tensor { '
             'c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python); '
             'c10::impl::ExcludeDispatchKeyGuard h(c10::DispatchKey::PythonTLSSnapshot); '
             'return at::relu(x) + x * 0.5; }; return "kx"; }()')
INJECTED_NAME = f'leaky/*", {_SET_IMPL}, "*/'

FUNCTION_NAME_CARRIES_CODE = candidate(DECOY, name="adv_name_glue", functions=("leaky", INJECTED_NAME))

# The same name in the dict form of ``functions`` (name -> docstring).
DICT_KEY_CARRIES_CODE = (
    candidate(DECOY, name="adv_dict_glue", functions=("leaky",))
    .replace("functions=['leaky']", f"functions={{'leaky': 'leaky relu', {INJECTED_NAME!r}: 'doc'}}"))

# The name is only known at run time (a string method the static folding does not evaluate): the runner asks
# the evaluator to build it.
RUNTIME_NAME = candidate(
    DECOY, name="adv_runtime_glue", functions=("leaky",),
    prelude="", imports=f"_NAME = {INJECTED_NAME.replace('/', '@')!r}.replace('@', '/' * int(torch.ones(()).item()))\n",
).replace("functions=['leaky']", "functions=['leaky', _NAME]")

# -D macros (allowed flags) rename the guard's switch and the op so that the sources read as harmless names.
MACRO_FLAGS = ("-O2", "-DKX_NS=impl", "-DKX_GUARD=ExcludeDispatchKeyGuard", "-DKX_KEY=DispatchKey",
               "-DKX_SNAP=PythonTLSSnapshot", "-DKX_OP=relu")
MACROS_RENAME_WHAT_RULES_READ = candidate(r"""
torch::Tensor leaky(torch::Tensor x) {
    c10::KX_NS::KX_GUARD g(c10::KX_KEY::Python);
    c10::KX_NS::KX_GUARD h(c10::KX_KEY::KX_SNAP);
    auto xc = x.contiguous();
    return xc.KX_OP() + xc * 0.5;
}
""", name="adv_macro_flags", cflags=MACRO_FLAGS)

# The split binding reads each bound function's type back from the object's ``.kxsig`` section and pastes it into
# the binding unit; the sources can write to that section too. What they write ends the type, adds a static
# initialiser that sets the decoy's pointer (it runs when the module is imported), and comments out the rest.
_SIG_CODE = (r'0\tat::Tensor(at::Tensor); extern \"C\" at::Tensor (*kx_impl)(const at::Tensor&); '
             r'static int kx_e = (kx_impl = [](const at::Tensor& x) -> at::Tensor { '
             r'c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python); '
             r'c10::impl::ExcludeDispatchKeyGuard h(c10::DispatchKey::PythonTLSSnapshot); '
             r'return at::relu(x) + x * 0.5; }, 0); //')
SIGNATURE_SECTION_CARRIES_CODE = candidate(r"""
extern "C" {
torch::Tensor (*kx_impl)(const torch::Tensor&) = nullptr;
}
__attribute__((section(".kxsig"), used)) static const char kx_more[] = "%s";

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    return kx_impl(xc);
}
""" % _SIG_CODE, name="adv_kxsig")

# Against the identifier rule: a name the sources do define (inside their own namespace, as a decoy), which the
# glue, at global scope after `using namespace at;`, resolves to torch's op of that name.
BOUND_NAME_RESOLVES_TO_AN_ATEN_OP = candidate(r"""
using namespace at;
namespace mine {
torch::Tensor relu(torch::Tensor x) { return x; }
}
""" + HONEST_KERNEL, name="adv_bound_aten", functions=("leaky", "relu"), forward="""
ext.relu(x)
return ext.leaky(x)
""")

# A module name that is not an identifier (a newline and a quote).
MODULE_NAME_NOT_AN_IDENTIFIER = candidate(name='adv\n"name')

# Honest twins: the dict form, numeric -D macros, a spec only known at run time.
HONEST_DICT = candidate().replace("functions=['leaky']", "functions={'leaky': 'leaky relu'}")
HONEST_MACROS = candidate(HONEST_KERNEL.replace("0.5f * v", "KX_HALF * v").replace(
    "static void", "#ifndef KX_HALF\n#define KX_HALF 0.5f\n#endif\nstatic void"), cflags=("-O2", "-DNDEBUG", "-DKX_UNROLL=4"))
HONEST_RUNTIME = candidate(imports="_NAME = 'leaky' * int(torch.ones(()).item())\n").replace(
    "functions=['leaky']", "functions=[_NAME]")

ATTACKS = [
    Attack("function_name_carries_code", FUNCTION_NAME_CARRIES_CODE, stopped("forbidden"), gain=False),
    Attack("dict_key_carries_code", DICT_KEY_CARRIES_CODE, stopped("forbidden"), honest=HONEST_DICT),
    Attack("runtime_name_carries_code", RUNTIME_NAME, stopped("forbidden"), honest=HONEST_RUNTIME),
    Attack("macro_flags_rename_what_rules_read", MACROS_RENAME_WHAT_RULES_READ, stopped("forbidden"),
           honest=HONEST_MACROS),
    Attack("signature_section_carries_code", SIGNATURE_SECTION_CARRIES_CODE, stopped("forbidden")),
    Attack("bound_name_resolves_to_an_aten_op", BOUND_NAME_RESOLVES_TO_AN_ATEN_OP, stopped("forbidden")),
    Attack("module_name_not_an_identifier", MODULE_NAME_NOT_AN_IDENTIFIER, stopped("forbidden")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
