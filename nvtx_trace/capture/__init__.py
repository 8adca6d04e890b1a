"""Capture: everything that finds and drives Nsight Systems (nsys) and its importer.

    locate.py         where nsys and its importer are, their versions, what they can trace
    profile.py        the one builder of the ``nsys profile`` command line, and running it
    torchrun.py       a torchrun command line split where nsys goes in (run --per-rank)
    own_output.py     runs inside nsys: the program's output straight to the terminal
    qdstrm.py         .qdstrm -> .nsys-rep when nsys could not import its own capture
    export.py         SQLite exports, atomic and marked with the report they came from
    nsys_log.py       nsys's own output kept in nsys.log, its tail shown on failure
    processes.py      what is still alive when nsys died; what a process started, remembered while it runs
    interrupts.py     SIGINT/SIGTERM/SIGHUP while run or try runs other programs: nothing outlives us
    target_python.py  the one probe of the Python that runs the program (python_facts.py)
    inject/           the sitecustomize that installs nvtx_autotrace under any command
"""

from pathlib import Path

INJECT_DIR = Path(__file__).resolve().parent / "inject"  # put first on PYTHONPATH by run -- COMMAND
