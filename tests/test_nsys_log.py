"""The pieces that keep nsys's chatter out of the terminal, without nsys: the wrapper that hands the program
our stdout/stderr, the sorter's list of nsys's own lines, and the log's progress-bar folding."""

from __future__ import annotations

import os
import subprocess
import sys

from nvtx_trace.capture import own_output
from nvtx_trace.capture.nsys_log import NsysLog
from nvtx_trace.capture.profile import NSYS_LINES

CHILD = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"


def wrapped(address=None):
    """Run CHILD through own_output with stdout/stderr on pipes, as nsys gives them."""
    env = dict(os.environ)
    if address is not None:
        env[own_output.ENV] = address
    return subprocess.run([sys.executable, own_output.__file__, sys.executable, "-c", CHILD],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_program_writes_to_the_descriptors_handed_over(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as fo, open(err, "w") as fe, own_output.Handover((fo.fileno(), fe.fileno())) as handover:
        proc = wrapped(handover.address)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == ""  # nothing through "nsys's" pipes
    assert out.read_text() == "to stdout\n" and err.read_text() == "to stderr\n"


def test_when_nothing_is_handed_over_the_output_is_left_alone_and_the_fallback_announced():
    with own_output.Handover() as handover:
        address = handover.address
    proc = wrapped(address)  # closed: as if nsys had run the program after we stopped listening
    assert proc.stdout == "to stdout\n"
    assert proc.stderr == own_output.FALLBACK_MARKER + "\nto stderr\n"


def test_without_the_variable_the_wrapper_only_runs_the_program():
    proc = wrapped()
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "to stdout\n", "to stderr\n")


# Lines nsys 2022.4 printed on this machine for `run` (profile, then our import and export), and lines a
# training program prints: the first go to the log, the second to the terminal.
NSYS_SAID = [
    "Importer error status: The importer binary and its dependencies were not found.",
    "Unable to retrieve the importer version: skipping importation of the QDSTRM file.",
    "Generating '/tmp/nsys-report-1206.qdstrm'",
    "Generated:",
    "    /tmp/chat/o1/report.qdstrm",
    "Capture range started in the application.",
    "Capture range ended in the application.",
    "WARNING: CPU context switch tracing not supported, disabling.",
    "Collecting data...",
    "[1/1] [========================100%] report.nsys-rep",
    own_output.FALLBACK_MARKER,
]
PROGRAM_SAID = ["step 3 loss 0.25 ms 16.1", "WARNING:root:learning rate is high", "Generation 4 done",
                "/data/train/shard-0001.tar", "done", "[epoch 1] loss 0.3"]


def test_nsys_own_lines_are_told_from_a_training_program_lines():
    assert [line for line in NSYS_SAID if not NSYS_LINES.match(line)] == []
    assert [line for line in PROGRAM_SAID if NSYS_LINES.match(line)] == []


def test_the_log_keeps_each_progress_bar_at_its_last_state_only(tmp_path):
    log = NsysLog(tmp_path / "nsys.log")
    output = ("\nProcessing [0%        ]\rProcessing [==50%    ]\nProcessing [=====100%]\n"
              "Saved report file to \"/x/report.nsys-rep\"\n"
              "Exporting 120 events: [1%    ]\nExporting 120 events: [==100%]\n")
    log.add("import", ["QdstrmImporter", "-i", "x"], output)
    assert log.path.read_text().splitlines() == [
        "== nsys import == QdstrmImporter -i x", "Processing [=====100%]", 'Saved report file to "/x/report.nsys-rep"',
        "Exporting 120 events: [==100%]"]
    assert log.tail(2) == 'Saved report file to "/x/report.nsys-rep" / Exporting 120 events: [==100%]'


def test_live_nsys_output_keeps_each_bar_at_its_last_state(tmp_path):
    """nsys 2025's bar as it printed it on the H100 ("[1/1] [==18%  ] report.nsys-rep"), line by line."""
    from nvtx_trace.capture.profile import _Sorter

    log = NsysLog(tmp_path / "nsys.log")
    sorter = _Sorter(log)
    take = sorter.sink(None)
    for line in ["Collecting data...\n", "Generating '/tmp/nsys-report-c686.qdstrm'\n",
                 "[1/1] [0%                          ] report.nsys-rep\n",
                 "[1/1] [==18%                       ] report.nsys-rep\n",
                 "[1/1] [========================100%] report.nsys-rep\n", "Generated:\n", "\t/x/report.nsys-rep\n"]:
        take(line)
    sorter.flush()
    assert log.path.read_text().splitlines() == [
        "Collecting data...", "Generating '/tmp/nsys-report-c686.qdstrm'",
        "[1/1] [========================100%] report.nsys-rep", "Generated:", "\t/x/report.nsys-rep"]
