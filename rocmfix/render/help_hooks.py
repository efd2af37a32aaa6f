"""What rocmfix changes in typer's help and usage errors, in one place: typer is a dependency
whose private attributes move between releases."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any, cast

import typer
import typer.core


def no_types() -> None:
    """typer's help shows a type beside every flag (``<bool>``, its own --help and
    --install-completion included), where there is no value to give, and beside an argument
    whose metavar already says what it takes (profile's ``-- COMMAND [ARGS]...``, not
    ``<list[str]>``): show none.

    This patches a private attribute of ``typer.core``'s parameter classes: a typer without
    it (older, newer, or another tool's) keeps its own help rather than stopping rocmfix at
    import."""
    for cls_name, hidden in (
        ("TyperOption", lambda param: bool(getattr(param, "is_flag", False))),
        ("TyperArgument", lambda param: bool(getattr(param, "metavar", None))),
    ):
        cls = getattr(getattr(typer, "core", None), cls_name, None)
        shown = getattr(cls, "display_type_rich", None)
        if cls is not None and callable(shown):
            with contextlib.suppress(AttributeError, TypeError):
                cls.display_type_rich = _hiding(shown, hidden)


def _hiding(shown: Callable[[Any, Any], Any], hidden: Callable[[Any], bool]) -> Any:
    def display_type_rich(self: Any, ctx: Any) -> Any:
        return None if hidden(self) else shown(self, ctx)

    return display_type_rich


def paragraphs(text: str) -> str:
    """A docstring's paragraphs each on one line. typer keeps the line breaks of every
    paragraph after the first, so a paragraph wrapped for the source comes out ragged in a
    terminal narrower than it; joined, rich wraps it at the terminal's width."""
    return "\n\n".join(
        " ".join(line.strip() for line in block.splitlines())
        for block in inspect.cleandoc(text).split("\n\n")
    )


class Command(typer.core.TyperCommand):
    """Every rocmfix command: its help reflowed (:func:`paragraphs`), its usage line showing
    an argument by its metavar as written, where typer would wrap a required one in braces
    and add dots (``{-- COMMAND [ARGS]...}...``), and its usage errors naming it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = paragraphs(self.help)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            metavar = param.metavar if isinstance(param, typer.core.TyperArgument) else None
            pieces.extend([metavar] if metavar else param.get_usage_pieces(ctx))
        return pieces

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:
            # The option parser raises some usage errors (an option missing its value)
            # without a context, and the hint would send the user to `rocmfix --help`
            # instead of this command's; click attaches it the same way to the errors of
            # parameters.
            if getattr(exc, "ctx", ctx) is None:
                cast(Any, exc).ctx = ctx
            raise
