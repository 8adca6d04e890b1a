"""What ``try`` and ``tune`` do alike around their runs, written once so the two never drift apart: the folder and
--json checked before anything runs, the history checked, the folder made (and removed again where nothing was
written into it), the outputs written, and what is said once they are."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nvtx_trace.errors import UsageError
from nvtx_trace.report.sections import printable


@dataclass(frozen=True)
class Verb:
    """A command that times the program plain and writes one folder: its name and the files it writes there."""

    name: str  # try, tune: the progress lines' prefix and the folder's suffix
    json: str  # its JSON in the folder (--json gets a copy)
    html: str
    first: str  # the folder its first runs write: one that holds it holds an earlier run's outputs
    done: str  # what it did to the script (``tried``), for the warning that the script changed meanwhile

    def say(self, message: str) -> None:
        """Progress on stderr, one line at a time."""
        print(f"nvtx-trace {self.name}: {printable(message)}", file=sys.stderr, flush=True)

    def say_tmp_warning(self) -> None:
        """Said at the start: a TMPDIR too deep for the program's DataLoader workers (``files.deep_tmp_note``)."""
        import os

        from nvtx_trace.files import deep_tmp_note

        note = deep_tmp_note(os.environ)
        if note:
            self.say(f"warning: {note}")

    def folder(self, out: Path | None, force: bool, name: Callable[[], str], now: float) -> Path:
        """The outputs' folder, checked before anything runs: --out (holding none of our outputs unless --force),
        or a fresh one under ./nvtx-trace-out named ``name()``."""
        from nvtx_trace.runner.plan import DEFAULT_OUT_ROOT, fresh_folder, given_folder

        if out is not None:
            given_folder(out)
            taken = [n for n in (self.json, self.html, self.first) if (out / n).exists()]
            if taken and not force:
                raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
            return out.resolve()
        return fresh_folder(Path(DEFAULT_OUT_ROOT), name(), now)

    def check_outputs(self, folder: Path, json_out: Path | None, inputs: list[Path], force: bool,
                      history_path: Path | None, no_history: bool):
        """--json and the history checked before anything runs: --json outside the folder (which gets our JSON
        itself) and no input; the history database one we may write, none of our outputs. Its path (None: none)."""
        from nvtx_trace.files import check_outputs, inside, same_path
        from nvtx_trace.runner import history

        if json_out is not None:
            if inside(json_out, folder):
                raise UsageError(f"--json {json_out} is inside the {self.name} folder {folder}, which gets {self.json} "
                                 "itself; give --json a path outside it")
            check_outputs([json_out], inputs, force)
        history_db = history.resolve_path(history_path, disabled=no_history)
        history.check(history_db, inputs=inputs,
                      written=lambda p: inside(p, folder) or (json_out is not None and same_path(p, json_out)))
        return history_db

    def write(self, folder: Path, result: dict, html: str, json_out: Path | None) -> list[Path]:
        """Our JSON and HTML in the folder, and the JSON at --json; the files written, in that order."""
        from nvtx_trace.files import write_atomically

        text = json.dumps(result, indent=2) + "\n"
        write_atomically(folder / self.json, text)
        write_atomically(folder / self.html, html)
        written = [folder / self.json, folder / self.html]
        if json_out:
            write_atomically(json_out, text)
            written.append(json_out)
        return written

    def said_after_writing(self, written: list[Path], script: Path | None, digest: str | None, folder: Path,
                           record) -> None:
        """What is said once the outputs are written: the script changed meanwhile (never by us: the knobs touch
        no file of the user's), each file written, and the history's warning (``record()`` adds the rows)."""
        from nvtx_trace.files import file_digest

        if script is not None and file_digest(script) != digest:
            self.say(f"warning: {script} changed while it was {self.done} (not by nvtx-trace: it writes only to "
                     f"{folder})")
        for path in written:
            print(f"Wrote {printable(path)}", file=sys.stderr)
        warning = record()
        if warning:
            self.say(f"warning: {warning}")


def make(folder: Path) -> bool:
    """The outputs' folder made where it is missing; whether it was (only a folder we made is removed again)."""
    from nvtx_trace.files import make_folder

    made = not folder.exists()
    make_folder(folder)
    return made


def drop_if_empty(folder: Path, made: bool) -> bool:
    """A folder we made, removed again where no file was written into it (stopped before the first one): the
    user's disk as before. Whether it holds files."""
    kept = any(p.is_file() for p in folder.rglob("*"))
    if not kept and made:
        shutil.rmtree(folder, ignore_errors=True)
    return kept
