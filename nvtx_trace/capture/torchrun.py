"""torchrun command lines taken apart, so that nsys can go inside: one ``nsys profile`` per rank.

``torchrun [its options] train.py ARGS`` starts ``python -u train.py ARGS`` once per rank; with
``--no-python`` it starts the command given instead. That is how NVIDIA's guides profile each rank:
``torchrun [its options] --no-python nsys profile -o rank%q{RANK} ... python -u train.py ARGS``
(nsys puts each rank's ``RANK`` variable into the file name). Nothing here runs anything.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# torchrun's options that take no value (torch 1.10 to 2.x; torch.distributed.launch's --use-env too);
# every other option takes one, as ``--opt VALUE`` or ``--opt=VALUE``.
FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                   "--virtual-local-rank", "--virtual_local_rank", "--use-env", "--use_env", "-h", "--help"})
# torchrun's options that take a value (torch 2.x), so that argparse's abbreviations (``--stand``, ``--nproc-per``)
# resolve as torchrun resolves them: a unique prefix of one option names it (an option's ``-``/``_`` spellings
# are one option here; an argparse that calls ``--nproc`` ambiguous stops torchrun before any rank starts).
VALUE_OPTIONS = frozenset({"--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend",
                           "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf",
                           "--rdzv_conf", "--max-restarts", "--max_restarts", "--monitor-interval",
                           "--monitor_interval", "--start-method", "--start_method", "--role", "--node-rank",
                           "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port",
                           "--local-addr", "--local_addr", "--log-dir", "--log_dir", "--redirects", "--tee",
                           "--local-ranks-filter", "--local_ranks_filter", "--logs-specs", "--logs_specs",
                           "--signals-to-handle", "--signals_to_handle", "--event-log-handler"})
MODULE_FLAGS = frozenset({"-m", "--module"})
NO_PYTHON_FLAGS = frozenset({"--no-python", "--no_python"})
RUN_PATH_FLAGS = frozenset({"--run-path", "--run_path"})  # runpy.run_path in-process: we start a Python instead
LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
RANK_FIELD = "%q{RANK}"  # nsys expands it from each rank's environment (torchrun sets RANK)
RANK_STEM = "rank" + RANK_FIELD


@dataclass
class Launch:
    """A torchrun command line, split where nsys goes in."""

    launcher: list[str]  # torchrun (or python -m torch.distributed.run) and its options, ours removed
    kind: str  # what each rank runs: "script" | "module" | "command" (the user's own --no-python)
    program: list[str]  # the script or module and its arguments, or the command and its arguments
    python: str  # the interpreter torchrun starts the ranks with
    nproc: str | None = None  # --nproc-per-node as given (a number, gpu, cpu, auto), when given
    nnodes: str | None = None  # --nnodes as given (a number or MIN:MAX), when given

    @property
    def local_ranks(self) -> int | None:
        """How many ranks this host starts, when the command line (or torchrun's PET_ variable) gives a number."""
        return int(self.nproc) if self.nproc and self.nproc.isdigit() else None

    def rank_argv(self, python: str | None = None, autotrace: bool = True) -> list[str]:
        """What nsys starts in each rank: ``python -u [-m nvtx_autotrace] train.py ARGS`` (-u as torchrun does)."""
        if self.kind == "command":
            return list(self.program)
        head = [python or self.python, "-u", *(["-m", "nvtx_autotrace"] if autotrace else [])]
        return head + (["-m", *self.program] if self.kind == "module" else list(self.program))


def _python_of_launcher(path: str) -> str:
    """The interpreter named in a launcher script's ``#!`` line (pip writes torchrun that way), else ours."""
    found = shutil.which(path) or path
    try:
        with open(found, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    if not first.startswith("#!"):
        return sys.executable
    words = first[2:].split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    return words[0] if words and os.path.basename(words[0]).startswith("python") else sys.executable


def parse(target: Sequence[str]) -> Launch | None:
    """The launch, or None when ``target`` is no torchrun command (``torchrun ...``, ``python -m
    torch.distributed.run ...``). A torchrun line with nothing to run gives a Launch with no program."""
    target = list(target)
    if not target:
        return None
    if os.path.basename(target[0]) == "torchrun":
        start, python = 1, _python_of_launcher(target[0])
    elif (os.path.basename(target[0]).startswith("python") and len(target) > 2 and target[1] == "-m"
          and target[2] in LAUNCH_MODULES):
        start, python = 3, target[0]
    else:
        return None
    launcher, kind, given, i = target[:start], "script", {}, start
    while i < len(target):
        arg = target[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name = _resolve(arg.split("=", 1)[0])
        if arg[:2] in SHORT_FLAGS and len(arg) > 2 and not arg.startswith("--"):  # -mr3: -m, then -r3
            target[i + 1:i + 1] = ["-" + arg[2:]]
            arg = name = arg[:2]
        if name in MODULE_FLAGS:
            kind = "module"
        elif name in NO_PYTHON_FLAGS:
            kind = "command"
        elif name in RUN_PATH_FLAGS:
            pass
        elif name in FLAGS:
            launcher.append(arg)
        else:
            attached = "=" in arg or (not arg.startswith("--") and len(arg) > 2)  # --opt=V, -rV (argparse's way)
            if attached:
                value = arg.split("=", 1)[1] if arg.startswith("--") else arg[2:].removeprefix("=")
            else:
                value = target[i + 1] if i + 1 < len(target) else None
            given[name.replace("_", "-") if arg.startswith("--") else name[:2]] = value
            launcher += [arg] if attached else target[i:i + 2]
            i += 0 if attached else 1
        i += 1
    return Launch(launcher=launcher, kind=kind, program=target[i:], python=python,
                  nproc=given.get("--nproc-per-node", os.environ.get("PET_NPROC_PER_NODE")),
                  nnodes=given.get("--nnodes", os.environ.get("PET_NNODES")))


SHORT_FLAGS = frozenset(f for f in FLAGS if not f.startswith("--"))


def _resolve(name: str) -> str:
    """An option as argparse reads it: a long option's unique prefix names that option (``--stand``)."""
    if not name.startswith("--") or name in FLAGS or name in VALUE_OPTIONS:
        return name
    known = {o.replace("_", "-") for o in FLAGS | VALUE_OPTIONS if o.startswith(name)}
    return known.pop() if len(known) == 1 else name  # none or several: torchrun itself refuses it


def rank_stem(out_dir: Path) -> Path:
    return Path(out_dir) / RANK_STEM


def rank_of(path: Path) -> int | None:
    """``rank3.nsys-rep`` -> 3 (None for any other name)."""
    name = Path(path).name
    digits = name[4:].split(".", 1)[0] if name.startswith("rank") else ""
    return int(digits) if digits.isdigit() else None
