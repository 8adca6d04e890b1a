"""The loss of the first steps, for ``nvtx-trace try``'s numerics check (a knob like amp or tf32 changes them).

``NVTX_AUTOTRACE_LOSSES=N`` keeps the sum of the scalars ``Tensor.backward`` is called on in each of steps 0..N-1
(the loss the program computes; with gradient accumulation, its micro-batches' losses together: the step's loss
where the program divides each by the accumulation steps, as most do, so a larger micro-batch with fewer steps
gives the same figure), without reading it: no sync inside those steps. When step N begins they are read (one
sync, in warm-up, before any timed step) and written to the window file as one ``losses`` event.
"""

from __future__ import annotations

from nvtx_autotrace import _registry, steps, window_file

_kept: dict[int, object] = {}


def install(n: int) -> None:
    import torch

    _kept.clear()

    def make_backward(original):
        def backward(self, *args, **kwargs):
            try:
                step = steps.current_step()
                if step < n and self.numel() == 1:
                    loss = self.detach().float()
                    _kept[step] = _kept[step] + loss if step in _kept else loss
            except Exception:  # noqa: BLE001 - a note we can do without
                pass
            return original(self, *args, **kwargs)

        return backward

    _registry.patch(torch.Tensor, "backward", make_backward, contain=False, mark=False)
    _registry.on_undo(steps.on_step_boundary_once(n, lambda: _write(n)))


def _write(n: int) -> None:
    try:
        values = [float(_kept[s]) if s in _kept else None for s in range(n)]
    except Exception:  # noqa: BLE001 - e.g. a loss on a device that is gone
        return
    _kept.clear()
    window_file.note("losses", values=values)
