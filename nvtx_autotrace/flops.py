"""Model FLOPs per step, counted once in warm-up (``NVTX_AUTOTRACE_FLOPS``, set by ``nvtx-trace tune``).

``torch.utils.flop_counter``'s formulas, counted by a dispatch mode entered when step ``FLOPS_STEP`` begins and
left when the next begins, so it counts that whole step (forward, loss, backward: the autograd threads inherit
the mode, and the optimizer). It slows that one step several times over, which is why it is a warm-up step and counted once; the
count goes into the settings record (``model_flops_per_step``), where the analyzer turns it into FLOP/s.
Programs already compiled when the step begins are not counted (the mode would make graphs anew).
"""

from __future__ import annotations

from nvtx_autotrace import _registry, settings, steps

FLOPS_STEP = 2  # step 0 compiles and initialises lazily; step 1 writes the settings record


def install() -> None:
    state: dict = {}

    def begin() -> None:
        import torch

        from nvtx_autotrace.budget import compiled, find_roots

        lead = steps._lead() if steps._lead is not None else None
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if capturing or any(compiled(r) for r in find_roots(lead)):
            return
        mode = _counter()
        mode.__enter__()
        state["mode"] = mode

    def end() -> None:
        mode = state.pop("mode", None)
        if mode is None:
            return
        mode.__exit__(None, None, None)
        settings.note("model_flops_per_step", int(mode.total))
        settings.note("model_conv_flops_per_step", int(mode.conv))  # cuDNN runs these in TF32 by default
        settings.note("flops_step", FLOPS_STEP)

    guard = _registry.Guard("flops")
    _registry.on_undo(steps.on_step_boundary_once(FLOPS_STEP, guard.hook(begin)))
    _registry.on_undo(steps.on_step_boundary_once(FLOPS_STEP + 1, guard.hook(end)))


def _counter():
    """FlopCounterMode's formulas (``flop_registry``: matmuls, convolutions, attention) without its module
    tracker, whose hooks on every module's forward and backward upset the module ranges' own autograd hooks."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Count(TorchDispatchMode):
        total = conv = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                flops = formula(*args, **kwargs, out_val=out)
                self.total += flops
                if "convolution" in str(func._overloadpacket):
                    self.conv += flops
            return out

    return Count()
