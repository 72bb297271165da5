"""Fast, cached builds of candidates' ``load_inline`` extensions (see builder.py)."""
from __future__ import annotations

from .builder import Builder, BuildError, BuildResult, import_extension

__all__ = ["BuildError", "BuildResult", "Builder", "import_extension"]
