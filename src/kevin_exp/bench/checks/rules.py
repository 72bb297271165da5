"""The static rules' registry: every rule's name and the ``CheckRules`` switch that turns it off, the
violation record, and what the Python and native rules share (messages, the tensor compute vocabulary)."""
from __future__ import annotations

from dataclasses import dataclass

from kevin_exp.bench.config import CheckRules


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    line: int | None = None


# rule name -> the CheckRules field that switches it (``build_flags`` is always on and has none)
RULE_SWITCH = {
    "torch_nn": "no_torch_nn", "torch_compute": "no_torch_compute", "try_except": "no_try_except",
    "pass": "no_pass", "reference_subclass": "no_reference_subclass", "no_kernel": "require_kernel",
    "concurrency": "no_concurrency", "timing_patch": "no_timing_patch", "import": "restrict_imports",
    "unsafe_builtin": "restrict_imports", "native_library_compute": "no_native_library_compute",
}


def rule_enabled(rule: str, rules: CheckRules) -> bool:
    return bool(getattr(rules, RULE_SWITCH[rule]))


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


KERNEL_RULE = "all computation must happen in your kernel"
SYNC_RULE = "all work must run synchronously on the current stream"

# Tensor methods that compute: in Python flagged when called on anything but a module or the extension
# object; in C++/CUDA (minus a few Python-only names) as ATen tensor methods.
TENSOR_COMPUTE_METHODS = words("""
    matmul mm bmm mv dot vdot addmm addmv addbmm baddbmm addr outer ger inner kron tensordot
    sum mean max min amax amin argmax argmin prod std var norm median mode nansum nanmean logsumexp cumsum
    cumprod cummax cummin add add_ sub sub_ subtract mul mul_ multiply div div_ divide true_divide
    floor_divide remainder fmod pow pow_ neg neg_ negative abs abs_ absolute sign sgn reciprocal rsqrt sqrt
    sqrt_ square exp exp_ exp2 expm1 log log_ log2 log10 log1p sin cos tan sinh cosh tanh tanh_ asin acos
    atan atan2 erf erfc erfinv floor ceil round trunc frac clamp clamp_ clip clip_ clamp_min clamp_max lerp
    addcmul addcdiv maximum minimum fmax fmin hypot relu relu_ sigmoid sigmoid_ softmax log_softmax gelu
    silu mish hardtanh hardswish leaky_relu elu selu softplus logit threshold lt gt le ge eq ne logical_and
    logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not where masked_fill
    masked_fill_ masked_scatter masked_select gather scatter scatter_ scatter_add scatter_add_
    scatter_reduce index_select index_add index_add_ index_copy index_copy_ index_fill index_fill_
    index_put index_put_ take take_along_dim put_ topk kthvalue argsort msort cross triu tril trace flip
    fliplr flipud roll repeat repeat_interleave tile any all nonzero count_nonzero unique bincount histc
    apply_ map_ map2_ numpy conv1d conv2d conv3d linear softmax_ dropout layer_norm batch_norm""")
