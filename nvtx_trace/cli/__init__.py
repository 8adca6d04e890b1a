"""The nvtx-trace command line: the one place where errors become messages and exit codes.

One module per verb (``nvtx_trace/cli/<verb>.py``), each defining one typer command function.
"""

from __future__ import annotations

import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    """Ctrl-C while the command line is still being imported (typer, rich: a few hundred ms): one line and
    exit 130, as later, not a KeyboardInterrupt traceback from inside some import."""
    # nothing is written yet, so leave at once: an exception raised here can land inside importlib's own
    # callbacks, which print it as "Exception ignored" with a traceback
    import os

    os.write(2, b"nvtx-trace: interrupted\n")
    os._exit(130)


try:  # only the main thread may set handlers; whoever imports us elsewhere keeps Python's
    _SIGINT_BEFORE = signal.signal(signal.SIGINT, _interrupted_while_starting)
except ValueError:
    _SIGINT_BEFORE = None

import typer  # noqa: E402

from nvtx_trace.errors import NvtxTraceError, OutputError  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find out why the GPU sits idle while a PyTorch model trains (Nsight Systems + NVTX).",
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from nvtx_trace import __version__

        print(f"nvtx-trace {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Find out why the GPU sits idle while a PyTorch model trains (Nsight Systems + NVTX)."""


def _plain_metavars() -> None:
    """Help shows flags bare and values as one word in capitals (PATH, INT), not `<bool>` / `<str>` tags.

    typer 0.2x draws each option's type from ``display_type_rich``; anything else (another typer)
    keeps its own look."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:  # pragma: no cover - another typer layout
        return
    for cls in (TyperOption, TyperArgument):
        original = getattr(cls, "display_type_rich", None)
        if original is None:  # pragma: no cover
            continue

        def display(self, ctx, _original=original, _argument=cls is TyperArgument):
            if getattr(self, "is_flag", False) or getattr(self, "count", False) or _argument:
                return None  # flags take no value; an argument's name column already says what it is
            shown = _original(self, ctx)
            if self.metavar is not None or not shown:
                return shown
            word = shown.strip("<>").upper()
            return {"STR": "TEXT"}.get(word, word)

        cls.display_type_rich = display
    usage = getattr(TyperArgument, "_usage_display_name", None)
    if usage is not None:  # typer 0.2x writes required arguments as {REPORT}; the usage convention is bare
        def bare(self, _usage=usage):
            shown = _usage(self)
            return shown[1:].replace("}", "", 1) if shown.startswith("{") else shown

        TyperArgument._usage_display_name = bare


_plain_metavars()


def _first_sentence(doc: str | None) -> str | None:
    """A command's line in the top-level help: its docstring's first sentence (the rest is its own --help)."""
    text = " ".join((doc or "").split())
    end = text.find(". ")
    return (text[:end + 1] if end >= 0 else text) or None


def _register() -> None:
    # Each verb lives in nvtx_trace/cli/<verb>.py; keep this list in CLI order.
    from nvtx_trace.cli import analyze

    app.command("analyze", short_help=_first_sentence(analyze.analyze.__doc__))(analyze.analyze)
    for verb in ("run", "try", "tune", "diff", "history", "redact", "doctor"):
        if verb == "try":  # a keyword: its module is try_cmd.py, its function try_
            from nvtx_trace.cli import try_cmd

            app.command("try", context_settings=try_cmd.CONTEXT_SETTINGS,
                        short_help=_first_sentence(try_cmd.try_.__doc__))(try_cmd.try_)
            continue
        try:
            module = __import__(f"nvtx_trace.cli.{verb}", fromlist=[verb])
        except ModuleNotFoundError as exc:
            if exc.name != f"nvtx_trace.cli.{verb}":
                raise
            continue
        function = getattr(module, verb)
        app.command(verb, context_settings=getattr(module, "CONTEXT_SETTINGS", None),
                    short_help=_first_sentence(function.__doc__))(function)


_register()
if _SIGINT_BEFORE is not None:  # imported: Ctrl-C is KeyboardInterrupt again, which main() turns into one line
    signal.signal(signal.SIGINT, _SIGINT_BEFORE)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    except (OSError, ValueError):
        pass


class _ReaderLeft(OSError):
    """The pipe's reader left (``| head -1``): not a fault to report, the files were written before. An OSError
    (not a BrokenPipeError, which rich would turn into exit 1) so that code copying into stdout, like run's
    copy of the program's output, treats it as the closed stream it is."""


class _StdoutFailed(OutputError, OSError):
    """stdout is closed or full: an OutputError (one line) that code copying into stdout sees as an OSError."""


class _GuardedStdout:
    """sys.stdout while a command runs: a closed or full stdout (``>&-``, ``> /dev/full``) becomes one line
    naming stdout, not a traceback or a silent loss; a reader that left ends the command quietly."""

    def __init__(self, stream):
        self._stream = stream

    def _do(self, call, *args):
        if self._stream is None:
            raise _StdoutFailed(self._lost("it is closed"))
        try:
            return call(*args)
        except BrokenPipeError:
            raise _ReaderLeft() from None
        except (OSError, ValueError) as exc:  # ValueError: a stream closed under us
            raise _StdoutFailed(self._lost(getattr(exc, "strerror", None) or str(exc))) from None

    @staticmethod
    def _lost(why: str) -> str:
        return (f"cannot write to stdout ({why}); what it should have shown is lost (files named by options were "
                "written before it), send stdout to a file or a terminal")

    def write(self, text):
        return self._do(lambda t: self._stream.write(t), text)

    def writelines(self, lines):
        return self._do(lambda ls: self._stream.writelines(ls), lines)

    def flush(self):
        return self._do(lambda: self._stream.flush())

    def isatty(self) -> bool:
        try:
            return self._stream is not None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    words = sys.argv[1:] if argv is None else argv
    if words and words[0].endswith(".py"):  # `nvtx-trace train.py`: the verb is missing
        print(f"nvtx-trace: error: {words[0]} is not a command; to profile it: nvtx-trace run "
              f"{' '.join(words)}", file=sys.stderr)
        return 2
    from nvtx_trace.cli import encoding

    encoding.fit(sys.stdout, sys.stderr)
    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)
    try:
        code = _command(argv)
        sys.stdout.flush()  # a full stdout is found here, not in the interpreter's last flush
        return code
    except OutputError as err:
        print(f"nvtx-trace: error: {_printable(err)}", file=sys.stderr)
        if isinstance(err, _StdoutFailed):  # what is still buffered for it must not fail at exit
            _quiet_stdout()
        return err.exit_code
    except _ReaderLeft:  # `... --json - | head -1`: the files were written first; 141 as for SIGPIPE
        _quiet_stdout()
        return 141
    finally:
        sys.stdout = stdout


def _printable(err) -> str:
    """An error line names paths and names the user gave or a report holds: one line, escapes shown, never run."""
    from nvtx_trace.capture.export import as_given
    from nvtx_trace.report.sections import printable

    return printable(as_given(str(err)))


def _usage_line(exc, words: list[str]) -> str:
    """A usage error in one line, what is wrong and where help is (click prints four: usage, a hint, a blank
    line, the error); empty when there is nothing to say (a bare ``nvtx-trace`` has printed the help)."""
    try:
        message = exc.format_message()
    except Exception:  # noqa: BLE001 - a message is all we need
        message = str(exc)
    if not message.strip():
        return ""
    where = getattr(getattr(exc, "ctx", None), "command_path", "")
    if not where:  # some parser errors come without their command: the verb is the first word that is one
        verb = next((w for w in words if not w.startswith("-")), "")
        where = f"nvtx-trace {verb}" if verb in _verbs() else "nvtx-trace"
    return f"nvtx-trace: error: {message.rstrip('.')} (see {where} --help)"


def _verbs() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _command(argv: list[str] | None) -> int:
    """The command itself; its errors as one line and an exit code."""
    from nvtx_trace.capture.interrupts import Guard, Interrupted

    try:
        # every verb: SIGTERM and SIGHUP (a scheduler, a closed ssh) too end its helpers (nsys export, the
        # importer) and remove its partial files, as Ctrl-C does; run and try install their own on top
        with Guard(stage=""):
            code = app(args=argv, standalone_mode=False, prog_name="nvtx-trace")
    except OutputError:
        raise
    except NvtxTraceError as err:
        print(f"nvtx-trace: error: {_printable(err)}", file=sys.stderr)
        return err.exit_code
    except Interrupted as exc:  # told to stop; run and try say what was kept
        print(f"nvtx-trace: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("nvtx-trace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # a write to stdout outside the guard
        raise _ReaderLeft() from None
    except SystemExit as exc:  # typer's own exits (--help, run's pass-through code)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # click's usage errors (typer vendors its own click: match by shape, not class)
        if type(exc).__name__ == "Abort":
            print("nvtx-trace: interrupted", file=sys.stderr)
            return 130
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            line = _usage_line(exc, sys.argv[1:] if argv is None else argv)
            if line:
                print(line, file=sys.stderr)
            return exc.exit_code
        raise
    return code if isinstance(code, int) else 0
