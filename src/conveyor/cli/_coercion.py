"""Checking command-line values without Pydantic when no value needs converting.

typer (since its own copy of click) checks every option's value with a Pydantic
``TypeAdapter``, built the first time the option is parsed, given or not:
importing Pydantic and building the adapters costs a command about 90 ms, a
sixth of ``conveyor stats`` on SQLite. Most commands are given only strings and
flags, which are already what typer's check would make of them.
:func:`check_plain_value_directly` gives such options a check that passes a
``str`` (or a ``bool``) through as it is and hands any other value to typer's
own check, built only then; ints, floats and choices keep typer's check. A typer
that checks values with click's types (older releases) is left as it is.
"""

from __future__ import annotations

from typing import Any

#: The annotations whose typer check returns a value of that very type unchanged.
_PLAIN = (str, bool)


class _PlainValue:
    """The check of one option or argument: a value of its annotated type passes
    as it is; anything else goes to typer's own check, which then replaces this
    one (``coerce`` is the one method typer calls on it)."""

    __slots__ = ("annotation",)

    def __init__(self, annotation: type) -> None:
        self.annotation = annotation

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """The value typer's check would give, without building that check for a
        value that needs none."""
        if value is None or type(value) is self.annotation:
            return value
        from typer._coercion import build_runtime_param

        typers_own = build_runtime_param(param.type_descriptor)
        param._runtime_param = typers_own
        return typers_own.coerce(value, param=param, ctx=ctx)


def check_plain_value_directly(param: Any) -> None:
    """Give ``param`` (an option or argument of a typer command) the direct check
    of :class:`_PlainValue` if typer's would be its plain ``str`` or ``bool`` one:
    one value (not a list or a tuple), no parser of the command's own, no file,
    and typer's check not built yet."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return
    if param.multiple or param.nargs != 1 or descriptor.annotation not in _PLAIN:
        return
    if descriptor.parameter_info.parser is not None or descriptor.file_annotation is not None:
        return
    param._runtime_param = _PlainValue(descriptor.annotation)
