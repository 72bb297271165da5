"""Declared limits of the config schemas, and the check that enforces them once the config is composed.

A schema field says what it accepts where it is declared: ``choice(default, options)`` for an enumerated
value (options may be a callable that asks the code which values it implements, and ``planned`` names values
that are known but not built yet), ``number(default, ge=..., gt=..., le=..., lt=...)`` for a bounded number,
``auto_or_integer(default, ge=..., le=...)`` for a bounded integer or ``auto`` (resolved before a run starts).
``check_settings(cfg)`` walks the whole tree and returns every problem as one ``key=value: expected ...``
string, so a bad setting is refused before any model, compiler or cluster is touched.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

Options = Union[Sequence[str], Callable[[], Sequence[str]]]


@dataclass(frozen=True)
class Bounds:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def accepts(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self) -> str:
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if low and high:
            return f"a number in {low}, {high}"
        if low:
            return f">= {_num(self.ge)}" if self.ge is not None else f"> {_num(self.gt)}"
        return f"<= {_num(self.le)}" if self.le is not None else f"< {_num(self.lt)}"


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def choice(default: Any, options: Options, planned: Sequence[str] = (), nullable: bool = False) -> Any:
    return dataclasses.field(default=default, metadata={"options": options, "planned": tuple(planned),
                                                        "nullable": nullable})


def number(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"bounds": Bounds(ge, gt, le, lt)})


AUTO = "auto"


def auto_or_integer(default: Any, *, ge: int | None = None, le: int | None = None) -> Any:
    """An integer in bounds, or ``auto`` (a field typed ``Any``: OmegaConf keeps the int or the string)."""
    return dataclasses.field(default=default, metadata={"auto_or_integer": Bounds(ge=ge, le=le)})


def each(factory: Callable[[], list], *, options: Options | None = None, bounds: Bounds | None = None,
         non_empty: bool = False) -> Any:
    """A list field whose every element is checked (``tasks.levels``)."""
    return dataclasses.field(default_factory=factory, metadata={"each_options": options, "each_bounds": bounds,
                                                                "non_empty": non_empty})


def _options(options: Options) -> list[str]:
    return list(options() if callable(options) else options)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _check_field(key: str, value: Any, meta: Any) -> list[str]:
    problems: list[str] = []
    if "options" in meta:
        if value is None and meta["nullable"]:
            return []
        implemented = _options(meta["options"])
        if value in meta["planned"]:
            problems.append(f"{key}={value}: not implemented yet; implemented: {', '.join(implemented)}")
        elif value not in implemented:
            problems.append(f"{key}={_show(value)}: expected one of {', '.join(implemented)}")
    if "bounds" in meta and value is not None:
        bounds: Bounds = meta["bounds"]
        if isinstance(value, float) and not math.isfinite(value) or not bounds.accepts(value):
            problems.append(f"{key}={_show(value)}: expected {bounds.describe()}")
    if "auto_or_integer" in meta and value != AUTO:
        bounds = meta["auto_or_integer"]
        if isinstance(value, bool) or not isinstance(value, int) or not bounds.accepts(value):
            problems.append(f"{key}={_show(value)}: expected auto or an integer "
                            f"{bounds.describe().removeprefix('a number ')}")
    if "non_empty" in meta:
        if meta["non_empty"] and not value:
            problems.append(f"{key}=[]: expected at least one value")
        for item in value:
            if meta["each_options"] is not None and item not in _options(meta["each_options"]):
                problems.append(f"{key}={list(value)}: {item!r} is not one of {', '.join(map(str, _options(meta['each_options'])))}")
            if meta["each_bounds"] is not None and not meta["each_bounds"].accepts(item):
                problems.append(f"{key}={list(value)}: {item} is not {meta['each_bounds'].describe()}")
    return problems


def check_settings(cfg: Any, prefix: str = "") -> list[str]:
    """Every problem of a schema object and its children; a dataclass may add cross-field checks in
    ``extra_checks(prefix) -> list[str]``."""
    problems: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = prefix + f.name
        if dataclasses.is_dataclass(value):
            problems += check_settings(value, key + ".")
        else:
            problems += _check_field(key, value, f.metadata)
    extra = getattr(cfg, "extra_checks", None)
    if extra is not None:
        problems += extra(prefix)
    return problems
