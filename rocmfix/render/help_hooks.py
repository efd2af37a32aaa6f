"""What rocmfix changes in typer's help, in one place: typer is a dependency whose private
attributes move between releases."""

from __future__ import annotations

from typing import Any

import typer


def flags_show_no_type() -> None:
    """typer's help shows a ``<bool>`` type beside every flag, its own --help and
    --install-completion included, where there is no value to give; show none. This patches
    a private attribute: a typer without it (older, newer, or another tool's) keeps its own
    help rather than stopping rocmfix at import."""
    option = getattr(getattr(typer, "core", None), "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or not callable(shown):
        return

    def display_type_rich(self: Any, ctx: Any) -> Any:
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    try:
        option.display_type_rich = display_type_rich
    except (AttributeError, TypeError):
        return
