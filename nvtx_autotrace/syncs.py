"""Host syncs: reading a CUDA tensor on the host, and ``torch.cuda.synchronize()``.

Each makes the training thread wait for the GPU to drain its queue; a range
around it lets the analyzer show that the wait, not the GPU, is where time went.
Only calls on CUDA tensors get a range: ``.item()`` on a CPU tensor waits for nothing.
``.to("cpu")`` (blocking) is handled by copies.py, which owns the ``Tensor.to`` wrapper.

Each range names the line that asked (``sync item at train.py:87``): the first frame outside torch and
nvtx_autotrace, the user's or, where the framework itself reads the tensor (Lightning's logging, a Trainer's
loss accounting), the framework's. The name is built once per line and kept.
"""

from __future__ import annotations

import torch

from nvtx_autotrace import _backend, _registry, sites
from nvtx_autotrace._compile import compiling
from nvtx_trace import names

TENSOR_METHODS = ("item", "tolist", "numpy", "cpu")
_labels: dict[tuple, str] = {}  # (what, file:line) -> the range's name


def sync_label(what: str, depth: int = 2) -> str | None:
    """``sync WHAT at FILE:LINE`` for the caller ``depth`` frames up (sites.caller); None when the caller is
    nvtx_autotrace itself (the capture window's own synchronize is no sync of the program's)."""
    where = sites.caller(depth + 1)
    if where is sites.OURS:
        return None
    key = (what, where)
    label = _labels.get(key)
    if label is None:
        label = _labels[key] = names.sync(what, where)
    return label


def install() -> None:
    def make_method(what: str):
        def make(original):
            def method(self, *args, **kwargs):
                label = sync_label(what) if self.is_cuda and not compiling() else None
                if label is not None:
                    _backend.push(label)
                    try:
                        return original(self, *args, **kwargs)
                    finally:
                        _backend.pop()
                return original(self, *args, **kwargs)

            return method

        return make

    for what in TENSOR_METHODS:
        _registry.patch(torch.Tensor, what, make_method(what))

    def make_sync(original):
        def synchronize(*args, **kwargs):
            label = None if compiling() else sync_label("cuda.synchronize")
            if label is None:
                return original(*args, **kwargs)
            _backend.push(label)
            try:
                return original(*args, **kwargs)
            finally:
                _backend.pop()

        return synchronize

    _registry.patch(torch.cuda, "synchronize", make_sync)
