"""Host syncs: reading a CUDA tensor on the host, and ``torch.cuda.synchronize()``.

Each makes the training thread wait for the GPU to drain its queue; a range
around it lets the analyzer show that the wait, not the GPU, is where time went.
Only calls on CUDA tensors get a range: ``.item()`` on a CPU tensor waits for nothing.
``.to("cpu")`` (blocking) is handled by copies.py, which owns the ``Tensor.to`` wrapper.
"""

from __future__ import annotations

import torch

from nvtx_autotrace import _backend, _registry
from nvtx_autotrace._compile import compiling
from nvtx_trace import names

TENSOR_METHODS = ("item", "tolist", "numpy", "cpu")


def install() -> None:
    def make_method(what: str):
        label = names.sync(what)

        def make(original):
            def method(self, *args, **kwargs):
                if self.is_cuda and not compiling():
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

    sync_label = names.sync("cuda.synchronize")

    def make_sync(original):
        def synchronize(*args, **kwargs):
            if compiling():
                return original(*args, **kwargs)
            _backend.push(sync_label)
            try:
                return original(*args, **kwargs)
            finally:
                _backend.pop()

        return synchronize

    _registry.patch(torch.cuda, "synchronize", make_sync)
