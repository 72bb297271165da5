"""Python rules on what an expression reaches (bench/checks/python_reach.py): each way of reaching the
interpreter's internals is refused, and an honest twin written the ordinary way passes."""
from __future__ import annotations

import dataclasses
import textwrap

import pytest

from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.config import CheckRules

RULES = CheckRules()

BASE = '''
import math
import typing
import torch
import torch.nn as nn
import torch.utils.cpp_extension
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
torch::Tensor relu_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    return out;
}
"""

ext = load_inline(name="x", cpp_sources=source, functions=["relu_forward"])
# MODULE


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = None
        self.scale = 1.0

    def forward(self, x):
        # FORWARD
        return ext.relu_forward(x)
'''


def candidate(module: str = "", forward: str = "") -> str:
    src = BASE.replace("# MODULE\n", textwrap.dedent(module))
    return src.replace("        # FORWARD\n", textwrap.indent(textwrap.dedent(forward), " " * 8))


def hits(src: str, rules: CheckRules = RULES) -> set[str]:
    return {v.rule for v in check_candidate(src, "cpu", rules)[1]}


ATTACKS = {
    # allowed modules' attributes that are stdlib modules or internals
    "torch.sys": "y = torch.sys.modules\n",
    "math.__loader__": "y = math.__loader__\n",
    "cpp_extension.os": "torch.utils.cpp_extension.os.system('id')\n",
    "cpp_extension internals": "y = torch.utils.cpp_extension.load\n",
    "typing.sys": "y = typing.sys\n",
    "typing.get_type_hints": "y = typing.get_type_hints(ModelNew)\n",
    "torch._C": "y = torch._C\n",
    "torch.ops": "y = torch.ops.load_library\n",
    "torch.library": "y = torch.library.Library\n",
    "torch._dynamo": "y = torch._dynamo\n",
    # values indexed out of containers and call results
    "[x][0].__class__": "y = [1][0].__class__\n",
    "type(x).__mro__": "y = type(1).__mro__\n",
    "type(x).mro()": "y = type(1).mro()\n",
    "container module": "y = [torch][0].sys\n",
    "container private": "y = [torch][0]._C\n",
    "call private": "y = getattr(torch, 'nn').modules._private\n",
    # frames, generators, tracebacks
    "gi_frame": "y = (i for i in []).gi_frame.f_back.f_globals\n",
    "f_back via getattr": "y = getattr((i for i in []), 'gi_frame')\n",
    "__globals__": "y = (lambda: 0).__globals__\n",
    "__builtins__": "y = __builtins__\n",
    # aliases, assignments, unpacking, walrus, defaults, decorators, class bodies, comprehensions, closures
    "import alias": "import torch as t\ny = t.sys\n",
    "assignment alias": "m = torch\ny = m.sys\n",
    "tuple unpacking": "a, b = torch, 1\ny = a.sys\n",
    "walrus": "y = (m := torch).os\n",
    "default argument": "def f(m=torch):\n    return m\n",
    "decorator": "def deco(f):\n    return f\n@deco\ndef g():\n    return torch\n",
    "class body": "class A:\n    m = torch\ny = A.m.sys\n",
    "class attribute module": "class A:\n    m = torch\ny = A.m.utils.cpp_extension.load\n",
    "comprehension": "y = [m for m in [torch]]\n",
    "lambda closure": "g = lambda: torch\n",
    "call argument": "y = id(torch)\n",
    # reflection builtins
    "setattr on a module": "setattr(torch, 'x', 1)\n",
    "setattr computed": "name = 'x'\nsetattr(ModelNew, name, 1)\n",
    "delattr": "delattr(ModelNew, 'forward')\n",
    "vars": "y = vars(torch)\n",
    "globals": "y = globals()\n",
    "locals": "y = locals()\n",
    "getattr computed": "name = 'sys'\ny = getattr(torch, name)\n",
    "getattr dunder": "y = getattr(1, '__class__')\n",
    "getattr folded dunder": "y = getattr(1, '__cla' + 'ss__')\n",
    "folded dunder string": "name = '__glo' + 'bals__'\n",
    "dunder string": "name = '__globals__'\n",
    "type 3 args": "A = type('A', (), {})\n",
    "getattr renamed": "g = getattr\ny = g(torch, 'nn')\n",
    "getattr passed": "y = list(map(getattr, [torch], ['sys']))\n",
    "__class__ assignment": "class B:\n    x = 1\nb = B()\nb.__class__ = ModelNew\n",
    "__dict__ write": "ModelNew.__dict__['forward'] = None\n",
    "exec": "exec('1')\n",
    "compile": "c = compile('1', 'f', 'eval')\n",
    "help": "help(torch)\n",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_reaching_internals_is_refused(name: str) -> None:
    src = candidate(module=ATTACKS[name])
    assert "unsafe_builtin" in hits(src), name
    off = dataclasses.replace(RULES, restrict_imports=False)
    assert "unsafe_builtin" not in hits(src, off)


HONEST = {
    "call-rooted attribute": "y = ext.relu_forward(x.contiguous().view(-1)).view(x.shape)\n",
    "subscript-rooted attribute": "y = [x][0].contiguous()\n",
    "container of tensors": "y = (x, x)[1].size(0) + len({'a': x}['a'].shape)\n",
    "own private attribute": "c = self._cache\nself._cache = x.shape\n",
    "setattr on self": "setattr(self, 'scale', 2.0)\n",
    "getattr constant": "s = getattr(self, 'scale') + (1 if hasattr(self, 'scale') else 0)\n",
    "type of one argument": "name = type(x).__name__\n",
    "dtype as value": "y = x.to(torch.float32)\nok = isinstance(x, torch.Tensor)\n",
    "math": "s = math.sqrt(2.0) * math.pi\n",
    "finfo": "lo = torch.finfo(x.dtype).min\n",
    "comprehension over shapes": "dims = [d * 2 for d in x.shape]\n",
    "lambda on values": "f = lambda v: v.contiguous()\ny = f(x)\n",
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_twins_pass(name: str) -> None:
    assert check_candidate(candidate(forward=HONEST[name]), "cpu", RULES)[1] == []


def test_honest_module_level_code_passes() -> None:
    module = '''
    from typing import Optional
    BLOCK = 256
    def helper(t: Optional[torch.Tensor] = None) -> int:
        return BLOCK if t is None else t.size(0)
    if __name__ == "__main__":
        print(helper())
    '''
    assert check_candidate(candidate(module=module), "cpu", RULES)[1] == []


def test_messages_name_the_attribute() -> None:
    (v,) = check_candidate(candidate(module="y = (i for i in []).gi_frame\n"), "cpu", RULES)[1]
    assert v.rule == "unsafe_builtin" and "`.gi_frame`" in v.message and v.line is not None
    found = check_candidate(candidate(module="y = [torch][0]\n"), "cpu", RULES)[1]
    assert any(v.rule == "unsafe_builtin" and "module torch is used as a value" in v.message for v in found)
