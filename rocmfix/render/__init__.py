"""Everything rocmfix shows, one module per command family; nothing else prints."""

from rocmfix.render.console import (
    closed_pipe,
    error,
    internal_error,
    progress,
    text,
    waiting,
    warning,
)
from rocmfix.render.doctor import doctor_json, doctor_table
from rocmfix.render.kernels import kernels_json, kernels_table
from rocmfix.render.run import diff, run_summary
from rocmfix.render.status import (
    check_failures,
    next_step,
    patch_list,
    status_json,
    status_table,
)
from rocmfix.render.tune import tune_json, tune_reset, tune_table

__all__ = [
    "check_failures",
    "closed_pipe",
    "diff",
    "doctor_json",
    "doctor_table",
    "error",
    "internal_error",
    "kernels_json",
    "kernels_table",
    "next_step",
    "patch_list",
    "progress",
    "run_summary",
    "status_json",
    "status_table",
    "text",
    "tune_json",
    "tune_reset",
    "tune_table",
    "waiting",
    "warning",
]
