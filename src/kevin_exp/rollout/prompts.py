"""Turn prompts in the shape of Kevin's (paper App. D), for the cuda and cpu backends.

Turn 1: instruction + one-shot example + reference program. Turn k > 1: instruction + reference program +
every earlier attempt in order (its kernel, the model's summary, the evaluator's feedback). Earlier
chains of thought are dropped; when the prompt exceeds its budget the earliest attempts go first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

INSTRUCTION = {
    "cuda": (
        "You write custom CUDA kernels to replace the PyTorch operators in the given architecture to get "
        "speedups. Optimise for performance on an NVIDIA H100: consider shared memory, kernel fusion, warp "
        "primitives and vectorised memory access. Use torch.utils.cpp_extension.load_inline with CUDA sources, "
        "name your optimised architecture ModelNew (same constructor as Model), and keep inputs and outputs on "
        "the GPU. You may not use torch.nn (except Module, Parameter, containers and init) nor any PyTorch "
        "compute operator: all computation happens in your kernels. Output the complete architecture only, "
        "with no test code, in one ```python code block; after the code, summarise your changes in a few "
        "sentences. Your code will be compiled and run, and you will get feedback on correctness and speedup."
    ),
    "cpu": (
        "You write custom C++ kernels that run on the CPU to replace the PyTorch operators in the given "
        "architecture to get speedups. Consider cache blocking, loop order, vectorisation and OpenMP. Use "
        "torch.utils.cpp_extension.load_inline with C++ sources only (cpp_sources, no CUDA), name your "
        "optimised architecture ModelNew (same constructor as Model), and keep tensors on the CPU. You may not "
        "use torch.nn (except Module, Parameter, containers and init) nor any PyTorch compute operator: all "
        "computation happens in your C++ functions. Output the complete architecture only, with no test code, "
        "in one ```python code block; after the code, summarise your changes in a few sentences. Your code "
        "will be compiled and run, and you will get feedback on correctness and speedup."
    ),
}

EXAMPLE_REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]


def get_init_inputs():
    return []
'''

EXAMPLE_SOLUTION = {
    "cuda": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

ext = load_inline(name="add", cpp_sources="torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=cuda_source, functions=["add_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.add_cuda(a.contiguous(), b.contiguous())
''',
    "cpu": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = """
torch::Tensor add_cpu(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
    return out;
}
"""

ext = load_inline(name="add", cpp_sources=cpp_source, functions=["add_cpu"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.add_cpu(a.contiguous(), b.contiguous())
''',
}

RESTART = "Restart your reasoning process and generate new, complete code."


@dataclass(frozen=True)
class Attempt:
    """One earlier turn as the next prompt sees it: its kernel, summary and evaluator feedback."""

    code: str | None
    summary: str
    status: str
    feedback: str
    speedup: float | None = None


def feedback_text(attempt: Attempt) -> str:
    """Kevin's per-outcome feedback templates (paper App. D)."""
    s = attempt.status
    if s == "format_error":
        body = f"Your response failed to be parsed due to not adhering to the desired formatting. {attempt.feedback}"
    elif s == "infra_error":
        # the evaluator's own failure (a build that timed out under load, a killed compiler): nothing of its log is
        # quoted, and the model is not told that its code was wrong
        body = ("The evaluator failed to build or run this attempt for reasons of its own (not a problem with your "
                "code), so there is no feedback on it.")
    elif s == "compile_error":
        body = f"Your kernel failed to compile. Here is the error message:\n{attempt.feedback}"
    elif s in ("runtime_error", "crashed", "timeout"):
        body = f"Your kernel compiled successfully but had runtime errors. Here is the error message:\n{attempt.feedback}"
    elif s == "incorrect":
        body = f"Your kernel was incorrect. Here is the error message:\n{attempt.feedback}"
    elif s == "forbidden":
        body = f"Your kernel broke the rules and scores zero. {attempt.feedback}"
    elif s == "ok":
        body = (
            "Your kernel was correct but can be made faster. Here is the speedup you achieved relative to the "
            f"baseline: {attempt.speedup:.2f}x"
        )
    else:
        body = attempt.feedback
    return f"{body}\n{RESTART}"


def base_prompt(reference: str, backend: str, first_turn: bool) -> str:
    parts = [INSTRUCTION[backend]]
    if first_turn:
        parts += [
            "Here is an example architecture:\n```python\n" + EXAMPLE_REFERENCE + "```",
            "And its optimised version with a custom kernel:\n```python\n" + EXAMPLE_SOLUTION[backend] + "```",
        ]
    parts.append("You are given the following architecture:\n```python\n" + reference.strip() + "\n```")
    return "\n\n".join(parts)


def render_attempt(i: int, attempt: Attempt) -> str:
    code = attempt.code if attempt.code is not None else "(no code was parsed from this response)"
    out = f"Attempt {i}:\n```python\n{code.strip()}\n```"
    if attempt.summary:
        out += f"\nYour summary of this attempt: {attempt.summary.strip()}"
    return out + "\nFeedback: " + feedback_text(attempt)


def turn_prompt(
    reference: str,
    backend: str,
    history: list[Attempt],
    max_tokens: int,
    count_tokens: Callable[[str], int] = lambda s: len(s) // 4,
) -> tuple[str, int]:
    """The user message for the next turn, and how many earlier attempts were dropped to fit."""
    if not history:
        return base_prompt(reference, backend, first_turn=True), 0
    head = base_prompt(reference, backend, first_turn=False) + "\n\nHere are your previous attempts:"
    rendered = [render_attempt(i + 1, a) for i, a in enumerate(history)]
    dropped = 0
    while True:
        text = "\n\n".join([head, *rendered[dropped:]])
        if count_tokens(text) <= max_tokens or dropped >= len(rendered) - 1:
            return text, dropped
        dropped += 1
