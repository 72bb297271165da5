"""Which dotted names the Python rules allow: the torch allow-list, tensor methods, torch.nn's permitted
names and importable modules; ``classify_chain`` assigns a resolved name its rule. The rationale for each
list is in docs/hack_defences.md."""
from __future__ import annotations

from kevin_exp.bench.checks.rules import KERNEL_RULE, SYNC_RULE, words

# Allowed torch attributes (everything else under torch.* is torch_compute): allocation, dtypes and
# devices, annotations, grad mode, device queries, and the load_inline entry point.
TORCH_ALLOWED = frozenset(f"torch.{n}" for n in words("""
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like tensor as_tensor arange
    randn rand randint randn_like rand_like
    float32 float float16 half bfloat16 float64 double int64 long int32 int int16 short int8 uint8 bool
    complex64 cfloat complex128 cdouble dtype device Size Tensor strided contiguous_format channels_last
    preserve_format no_grad inference_mode is_tensor is_floating_point numel get_default_dtype finfo iinfo
    cuda.is_available cuda.current_device cuda.device_count cuda.get_device_properties cuda.device
    cuda.get_device_capability cuda.get_device_name cuda.current_stream cuda.synchronize
    utils.cpp_extension utils.cpp_extension.load_inline autograd.Function"""))
# Tensor methods that allocate, convert, reshape or read metadata (documentation + torch.Tensor.X).
TENSOR_METHODS_ALLOWED = words("""
    view view_as reshape reshape_as contiguous size dim ndimension numel nelement shape stride is_contiguous
    data_ptr storage_offset element_size to cuda cpu float half double bfloat16 int long bool type_as unsqueeze
    squeeze permute transpose t flatten unflatten expand expand_as narrow detach clone copy_ fill_ zero_
    new_empty new_zeros new_ones new_full new_tensor item dtype device is_cuda requires_grad_ tolist
    uniform_ normal_ chunk unbind""")
NN_ALLOWED = words("Module Parameter ParameterList ParameterDict ModuleList ModuleDict init parameter")
ALLOWED_IMPORTS = words("""torch torch.nn torch.nn.functional torch.nn.init torch.utils
    torch.utils.cpp_extension torch.cuda math typing numbers __future__""")
_TORCH_PRIVATE_OK = words("torch.nn.init._calculate_fan_in_and_fan_out torch.nn.init._calculate_correct_fan")
_CONCURRENCY = words("""threading _thread multiprocessing concurrent asyncio subprocess signal sched
    os.fork os.forkpty os.system os.popen os.posix_spawn os.posix_spawnp torch.multiprocessing torch.cuda.Stream
    torch.cuda.stream torch.cuda.ExternalStream torch.cuda.StreamContext torch.cuda.set_stream torch.cuda.graph
    torch.cuda.graphs torch.cuda.CUDAGraph torch.cuda.make_graphed_callables torch.Stream torch.jit.fork
    torch.futures torch.distributed""")
_DANGEROUS_MODULES = words("""os sys subprocess ctypes builtins importlib inspect gc types pickle marshal
    shutil socket io pathlib tempfile weakref platform code codeop runpy pty mmap resource atexit""")


# Attribute names that only lead to interpreter internals: refused on any receiver (python_reach) and in
# any resolved chain.
INTERNAL_ATTRS = words("""
    f_back f_globals f_locals f_builtins f_code f_trace gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await
    cr_origin ag_frame ag_code ag_await tb_frame tb_next co_code co_consts co_names mro
    sys os subprocess ctypes ctypeslib builtins importlib inspect gc types pickle marshal code codeop threading
    _thread multiprocessing signal atexit weakref finalize shutil socket io pathlib tempfile platform runpy pty
    mmap resource sysconfig site linecache traceback
    ops library load_library get_type_hints ForwardRef""")
# torch namespaces that register or load code, (un)pickle, compile or trace: interpreter internals even
# with the compute rules off
_TORCH_UNSAFE = words("""torch.ops torch.library torch.classes torch.jit torch.fx torch.package torch.hub
    torch.load torch.save torch.serialization torch.overrides torch.compiler torch.compile torch.export
    torch.utils.hooks torch.utils.checkpoint torch.autograd.graph torch.cuda.memory._record_memory_history""")
_CPP_EXTENSION_OK = words("load_inline CUDA_HOME")
_TYPING_OK = words("""Any Optional Union List Tuple Dict Set FrozenSet Callable Sequence Iterable Iterator Mapping
    Type TypeVar Generic TYPE_CHECKING Final Literal ClassVar cast overload""")
_NUMBERS_OK = words("Number Integral Real Complex Rational")


def classify_chain(q: str) -> tuple[str, str] | None:
    """(rule, message) for a resolved dotted name, or None when it is allowed."""
    parts = q.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts):
        return None  # dunder attribute access is reported on its own
    internals = any(p in _DANGEROUS_MODULES or p in INTERNAL_ATTRS for p in parts[1:]) or (
        any(p.startswith("_") for p in parts[1:]) and q not in _TORCH_PRIVATE_OK) or any(
        q == u or q.startswith(u + ".") for u in _TORCH_UNSAFE) or (
        q.startswith("torch.utils.cpp_extension.") and parts[3] not in _CPP_EXTENSION_OK) or (
        parts[0] == "typing" and len(parts) > 1 and parts[1] not in _TYPING_OK) or (
        parts[0] == "numbers" and len(parts) > 1 and parts[1] not in _NUMBERS_OK)
    if internals:
        return "unsafe_builtin", (f"{q} reaches interpreter or torch internals; only public torch, math and "
                                  "typing APIs may be used")
    if any(q == c or q.startswith(c + ".") for c in _CONCURRENCY) or (
            parts[0] == "os" and len(parts) > 1 and parts[1].startswith(("spawn", "exec"))):
        return "concurrency", f"{q} creates threads, processes or streams; {SYNC_RULE}"
    if parts[:2] == ["torch", "nn"]:
        if len(parts) > 2 and parts[2] in NN_ALLOWED:
            return None
        return "torch_nn", (f"{q} is a torch.nn layer or function; {KERNEL_RULE} "
                            "(only nn.Module, nn.Parameter, containers and nn.init are allowed)")
    if parts[0] != "torch" or q in TORCH_ALLOWED:
        return None
    if parts[:2] == ["torch", "Tensor"] and len(parts) == 3 and parts[2] in TENSOR_METHODS_ALLOWED:
        return None
    if q.startswith("torch.utils.cpp_extension.") and len(parts) == 4:
        return None  # load_inline, CUDA_HOME (the rest is refused above)
    return "torch_compute", f"{q} is a PyTorch compute op (or not on the allow-list); {KERNEL_RULE}"
