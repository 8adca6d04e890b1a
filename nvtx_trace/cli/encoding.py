"""Output a terminal cannot encode is spelled, not lost: an ASCII-only stdout (``PYTHONIOENCODING=ascii``, a C
locale) failed the whole report at the first "µ". Each character the stream's encoding lacks becomes its usual
ASCII spelling (µs -> us, -> for an arrow), else a backslash escape; what can be encoded is left as it is."""

from __future__ import annotations

import codecs

HANDLER = "nvtx_trace_spelled"
SPELLED = {"µ": "u", "μ": "u", "→": "->", "←": "<-", "…": "...", "–": "-", "—": "-", "×": "x", "≥": ">=",
           "≤": "<=", "±": "+/-", "≈": "~", "·": "*", "‘": "'", "’": "'", "“": '"', "”": '"', "•": "*", "°": " deg",
           "━": "-", "─": "-", "│": "|", "┃": "|", "▏": "|", "█": "#", "▌": "#", "\u00a0": " "}


def _spell(err: UnicodeEncodeError):
    text = err.object[err.start:err.end]
    return "".join(SPELLED.get(c) or c.encode("ascii", "backslashreplace").decode("ascii") for c in text), err.end


def fit(*streams) -> None:
    """Give each text stream that cannot encode the report's own characters the spelling handler."""
    try:
        codecs.lookup_error(HANDLER)
    except LookupError:
        codecs.register_error(HANDLER, _spell)
    for stream in streams:
        encoding = getattr(stream, "encoding", None)
        if not encoding or not hasattr(stream, "reconfigure"):
            continue
        try:
            "µ→…".encode(encoding)
        except UnicodeEncodeError:
            try:
                stream.reconfigure(errors=HANDLER)
            except (ValueError, OSError):  # a stream that cannot be changed (closed, detached): as it is
                pass
        except LookupError:
            pass
