"""Lean torch headers (shadowing torch/extension.h, torch/types.h, ATen/ATen.h) and their g++ PCHs.

The static part lives in ``lean_headers/``; the generated part (torch's allocation ops stripped of
their umbrella includes, and the list of standard headers torch's umbrella headers pull in) is
made once per torch install under ``<cache>/lean/<key>/``, because it must match the installed
torch exactly.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import time
from pathlib import Path

from . import cache, failures, proc
from .flags import LEAN_HEADERS_DIR, toolchain_id, torch_flags

LEAN_OPS = ("arange", "empty", "empty_like", "empty_strided", "full", "full_like", "ones", "ones_like",
            "zeros", "zeros_like")
PCH_HEADER = "torch/extension.h"  # the line torch prepends to every C++ source


@functools.lru_cache(maxsize=None)
def static_digest() -> str:
    files = sorted(p for p in LEAN_HEADERS_DIR.rglob("*.h"))
    return cache.digest([(str(p.relative_to(LEAN_HEADERS_DIR)), p.read_text()) for p in files])


def _torch_include() -> Path:
    import torch.utils.cpp_extension as ce

    return Path(ce.include_paths("cpu")[0])


def _strip_op_header(text: str) -> str:
    """Keep the generated inline wrappers, drop the umbrella includes (keep the *_ops.h one)."""
    return "\n".join(
        line for line in text.splitlines()
        if not line.startswith("#include") or re.search(r"_ops\.h>", line)
    ) + "\n"


def _dep_paths(deps: str) -> list[str]:
    """The paths of a `g++ -M` dependency list, where a space in a path is escaped (``/my\\ venv/...``)."""
    tokens = re.split(r"(?<!\\)\s+", deps.replace("\\\n", " "))
    return [t.replace("\\ ", " ") for t in tokens if t]


def _std_headers(deps: str) -> list[str]:
    """Top-level standard C++ headers (<vector>, <cmath>, ...) among a `g++ -M` dependency list."""
    names = set()
    for token in _dep_paths(deps):
        m = re.search(r"/c\+\+/[^/]+/([a-z_]+)$", token)
        if m:
            names.add(m.group(1))
    return sorted(names)


class LeanHeaders:
    def __init__(self, root: Path, timeout_s: float, memory_limit_gb: float) -> None:
        self.root = root
        self.timeout_s = timeout_s
        self.memory_limit_gb = memory_limit_gb

    @functools.cached_property
    def key(self) -> str:
        return cache.digest(["lean-gen-1", toolchain_id(False, self.root), static_digest()])

    def dirs(self) -> list[Path]:
        """Include dirs to put before torch's: the static shadows, then the generated headers."""
        gen = cache.entry_dir(self.root, "lean", self.key)
        if not (gen / "kx_ops").is_dir():
            with cache.locked(cache.lock_path(gen)):
                if not (gen / "kx_ops").is_dir():
                    self._generate(gen)
        return [LEAN_HEADERS_DIR, gen]

    def _generate(self, final: Path) -> None:
        tmp = cache.new_tmp_dir(final)
        inc = _torch_include()
        (tmp / "kx_ops").mkdir()
        for op in LEAN_OPS:
            (tmp / "kx_ops" / f"{op}.h").write_text(_strip_op_header((inc / "ATen" / "ops" / f"{op}.h").read_text()))
        tf = torch_flags()
        for umbrella, out in (("torch/extension.h", "kx_std_extension.h"), ("torch/types.h", "kx_std_types.h")):
            (tmp / "probe.cpp").write_text(f"#include <{umbrella}>\n")
            res = proc.run([tf.cxx, *tf.common, tf.std, "-M", "probe.cpp"], tmp, time.monotonic() + self.timeout_s,
                           self.memory_limit_gb)
            names = _std_headers(res.output) if res.ok else []
            (tmp / out).write_text("#pragma once\n" + "".join(f"#include <{n}>\n" for n in names))
        (tmp / "probe.cpp").unlink()
        cache.publish(tmp, final)


class PchStore:
    """Precompiled lean ``torch/extension.h`` per exact g++ flag set (gcc rejects a PCH whose flags
    differ, e.g. another -O level). A flag set gets its PCH on its ``min_uses``-th use."""

    def __init__(self, root: Path, lean: LeanHeaders, timeout_s: float, memory_limit_gb: float,
                 min_uses: int = 2) -> None:
        self.root, self.lean = root, lean
        self.timeout_s, self.memory_limit_gb, self.min_uses = timeout_s, memory_limit_gb, min_uses

    def key(self, flags: list[str]) -> str:
        return cache.digest(["pch-2", toolchain_id(False, self.root), static_digest(), self.lean.key, flags])

    def get(self, flags: list[str], build: bool | None = None) -> Path | None:
        """Dir holding ``torch/extension.h.gch`` for ``flags`` (pass it with -I first), or None.

        ``build``: True builds a missing PCH now, False never, None after ``min_uses`` uses.
        """
        key = self.key(flags)
        final = cache.entry_dir(self.root, "pch", key)
        if (final / (PCH_HEADER + ".gch")).exists():
            return final
        if build is False or (final.parent / f"{key}.failed").exists():
            return None
        if build is None and cache.bump_counter(final.parent / f"{key}.uses") < self.min_uses:
            return None
        if build:
            with cache.locked(cache.lock_path(final)):
                return final if (final / (PCH_HEADER + ".gch")).exists() else self._build(flags, final, key)
        # on demand: a unit compiles without the PCH rather than wait for another process's build
        with cache.try_locked(cache.lock_path(final)) as mine:
            if not mine:
                return None
            return final if (final / (PCH_HEADER + ".gch")).exists() else self._build(flags, final, key)

    def _build(self, flags: list[str], final: Path, key: str) -> Path | None:
        tmp = cache.new_tmp_dir(final)
        header = LEAN_HEADERS_DIR / PCH_HEADER
        gch = Path(PCH_HEADER).name + ".gch"
        # written into the job folder itself: a sandboxed compile may write there and nowhere else
        argv = [torch_flags().cxx, *flags, "-x", "c++-header", str(header), "-o", gch]
        res = proc.run(argv, tmp, time.monotonic() + self.timeout_s, self.memory_limit_gb)
        if not res.ok:
            # flags that cannot build it: stop trying (not when the machine failed: a timeout, a killed compiler)
            if "error" in res.output and not failures.machine_failed(res):
                (final.parent / f"{key}.failed").write_text(res.describe())
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        (tmp / "torch").mkdir()
        os.replace(tmp / gch, tmp / (PCH_HEADER + ".gch"))
        # a second `#include <torch/extension.h>` (sources often have one) looks for the header in
        # the dir where gcc found the .gch: give it the lean header there
        shutil.copyfile(header, tmp / PCH_HEADER)
        cache.write_json(tmp / "meta.json", {"flags": flags, "seconds": res.seconds})
        cache.publish(tmp, final)
        return final
