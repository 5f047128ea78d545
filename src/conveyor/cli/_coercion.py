"""Checking command-line values without Pydantic when no value needs converting.

typer (since its own copy of click) checks every option's value with a Pydantic
``TypeAdapter``, built the first time the option is parsed, given or not:
importing Pydantic and building the adapters costs a command about 90 ms, a
sixth of ``conveyor stats`` on SQLite. Most commands are given only strings and
flags, and defaults, which are already what typer's check would make of them.
:func:`check_plain_value_directly` gives such options a check that passes a
``str`` or a ``bool``, or an ``int`` within the option's ``min`` and ``max`` (a
default such as ``list --limit``'s), through as it is and hands any other value
(a number typed on the command line is a string) to typer's own check, built only
then; floats and choices keep typer's check. A typer that checks values with
click's types (older releases) is left as it is.
"""

from __future__ import annotations

from typing import Any

#: The annotations whose typer check returns a value of that very type unchanged
#: (an int: one within the option's inclusive min and max).
_PLAIN = (str, bool, int)


class _PlainValue:
    """The check of one option or argument: a value of its annotated type passes
    as it is; anything else goes to typer's own check, which then replaces this
    one (``coerce`` is the one method typer calls on it)."""

    __slots__ = ("annotation", "high", "low")

    def __init__(self, annotation: type, low: Any = None, high: Any = None) -> None:
        self.annotation = annotation
        #: The option's min and max (``None``: no bound), which typer's check enforces.
        self.low = low
        self.high = high

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """The value typer's check would give, without building that check for a
        value that needs none."""
        if value is None or (type(value) is self.annotation and self._within(value)):
            return value
        from typer._coercion import build_runtime_param

        typers_own = build_runtime_param(param.type_descriptor)
        param._runtime_param = typers_own
        return typers_own.coerce(value, param=param, ctx=ctx)

    def _within(self, value: Any) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


def check_plain_value_directly(param: Any) -> None:
    """Give ``param`` (an option or argument of a typer command) the direct check
    of :class:`_PlainValue` if typer's would be its plain ``str``, ``bool`` or
    ``int`` one: one value (not a list or a tuple), no parser of the command's
    own, no file, and typer's check not built yet."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return
    if param.multiple or param.nargs != 1 or descriptor.annotation not in _PLAIN:
        return
    if descriptor.parameter_info.parser is not None or descriptor.file_annotation is not None:
        return
    info = descriptor.parameter_info
    bounds = (getattr(info, "min", None), getattr(info, "max", None))
    if descriptor.annotation is not int and bounds != (None, None):
        return  # a ranged float or bool: typer's check
    param._runtime_param = _PlainValue(descriptor.annotation, *bounds)
