"""Typed errors: the library raises them, only the CLI turns them into one line and an exit code."""

from __future__ import annotations


class NvtxTraceError(Exception):
    """Base class: ``str(err)`` is the whole user-facing line (what is wrong, what to do)."""

    exit_code = 1


class UsageError(NvtxTraceError):
    """The command line asks for something impossible (bad option value, output exists)."""

    exit_code = 2


class BadReportError(NvtxTraceError):
    """The input is missing, unreadable, not SQLite, or not an Nsight Systems export."""

    exit_code = 3


class NsysNotFoundError(NvtxTraceError):
    """An nsys CLI is needed (profile, or export a .nsys-rep) and none was found."""

    exit_code = 4


class NsysFailedError(NvtxTraceError):
    """nsys ran but produced no usable report."""

    exit_code = 5


class OutputError(NvtxTraceError):
    """An output could not be written (full disk, read-only file system, /proc, a closed or full stdout):
    the line names the output, never the input."""

    exit_code = 1


class MissingDependencyError(NvtxTraceError):
    """A package an output needs is not installed (plotly for HTML): says what to install."""

    exit_code = 1
