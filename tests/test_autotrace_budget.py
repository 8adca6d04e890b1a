"""The default module ranges: chosen per program by a measured budget, through class-level
forward wrappers. What they must never do: change results, touch pickling or deepcopy,
install global module hooks (torch.compile would warn on every call), outlive uninstall."""

from __future__ import annotations

import copy
import io
import json
import sys
import warnings
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.torch

sys.path.insert(0, str(ROOT / "programs"))


def train(torch, model, steps: int, compile_backend: str | None = None, step_context=None):
    """A small SGD loop; ``step_context(i)`` wraps optimizer step i (e.g. no_grad, as SAM-style code does)."""
    import contextlib

    torch.manual_seed(0)
    run = torch.compile(model, backend=compile_backend) if compile_backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        loss = run(x).square().mean()
        loss.backward()
        with step_context(i) if step_context else contextlib.nullcontext():
            opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def tiny(torch):
    import cpu_train

    torch.manual_seed(0)
    return cpu_train.TinyNet()


def record_of(rec) -> dict:
    from nvtx_trace import names

    found = [n for n in rec.names() if n.startswith(names.INSTRUMENTATION_PREFIX)]
    assert len(found) == 1
    return json.loads(found[0][len(names.INSTRUMENTATION_PREFIX):])


def module_names(rec) -> list[str]:
    return [n for n in rec.names() if n.startswith(("forward ", "backward "))]


def test_no_global_module_hooks_and_ranges_from_step_3_with_a_generous_budget(at, torch):
    from torch.nn.modules import module as mm

    at.install(enabled="1", budget_pct=100)
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks
    model = tiny(torch)
    train(torch, model, 3)
    assert module_names(at.recorder) == []  # step 0: warm-up, steps 1-2: counted and timed
    train_more = train(torch, model, 2)
    assert train_more
    rec = record_of(at.recorder)
    assert rec["forward_depth"] == rec["backward_depth"] == rec["max_depth"] == 3
    assert rec["modules_ranged"] == 12 and rec["module_calls_per_step"] == 12  # TinyNet: 12 modules with a forward
    got = set(module_names(at.recorder))
    assert {"forward (TinyNet)", "forward blocks.0.fc1 (Linear)", "backward blocks.1.fc2 (Linear)"} <= got
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks


def test_a_tiny_budget_ranges_no_module_and_says_so(at, torch):
    at.install(enabled="1", budget_pct=1e-9)
    train(torch, tiny(torch), 6)
    rec = record_of(at.recorder)
    assert rec["forward_depth"] == rec["backward_depth"] == -1 and rec["modules_ranged"] == 0
    assert module_names(at.recorder) == []


def test_budget_chooses_deeper_forward_than_backward_ranges_when_only_those_fit(at, torch):
    """Forward ranges cost a fraction of backward ones: the choice uses the measured units."""
    from nvtx_autotrace import budget

    at.install(enabled="1")
    b = budget._current
    b.budget_pct = 100.0
    model = tiny(torch)
    train(torch, model, 2)  # boundaries 1 and 2: models found, step 1 counted and timed
    real = budget.calibrate

    def fixed_units():  # backward far dearer than forward; budget = 100 % of the plain step
        step_ns = min(b.times) * 1e9
        return {"module_forward_ns": int(step_ns / 100), "module_backward_ns": int(step_ns / 3), "range_ns": 1}

    budget.calibrate = fixed_units
    try:
        train(torch, model, 1)
    finally:
        budget.calibrate = real
    rec = record_of(at.recorder)
    assert rec["backward_depth"] == 0 and rec["forward_depth"] == 3  # 1 root x (1/3 + 1/100) fits, then 12 forwards


def test_losses_identical_and_model_pickles_and_deepcopies_unchanged(at, torch):
    plain = train(torch, tiny(torch), 6)
    at.install(enabled="1", budget_pct=100)
    model = tiny(torch)
    traced = train(torch, model, 6)
    assert [x.hex() for x in traced] == [x.hex() for x in plain]
    buf = io.BytesIO()
    torch.save(model, buf)  # whole-model pickling: class wrappers are not pickled with instances
    assert b"nvtx_autotrace" not in buf.getvalue()
    twin = copy.deepcopy(model)  # an EMA copy: its calls are its own, and not ranged
    n = len(module_names(at.recorder))
    x = torch.ones(2, 8)
    assert torch.equal(twin(x), model(x))
    assert len(module_names(at.recorder)) == n + 12  # only `model`'s 12 forwards (no backward ran)


def test_uninstall_restores_every_wrapped_class(at, torch):
    import cpu_train

    before = {cls: dict(vars(cls)) for cls in (torch.nn.Linear, torch.nn.ReLU, torch.nn.Sequential,
                                               cpu_train.TinyNet, cpu_train.Block)}
    at.install(enabled="1", budget_pct=100)
    train(torch, tiny(torch), 5)
    assert torch.nn.Linear.forward is not before[torch.nn.Linear]["forward"]
    at.uninstall()
    assert {cls: dict(vars(cls)) for cls in before} == before


def test_compiled_model_gets_no_torch_warning_and_one_range(at, torch):
    at.install(enabled="1", budget_pct=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = train(torch, tiny(torch), 6, compile_backend="eager")
    assert not [w for w in caught if "hook" in str(w.message) or "nvtx_autotrace" in str(w.message)], \
        [str(w.message) for w in caught]
    got = module_names(at.recorder)
    assert set(got) == {"forward (OptimizedModule)", "backward (OptimizedModule)"}
    assert losses == train(torch, tiny(torch), 6)


class Odd:
    """Modules whose forward is not a plain function, and one left half-built by a failed __init__."""

    @staticmethod
    def models(torch):
        class Static(torch.nn.Module):
            @staticmethod
            def forward(x):
                return x * 2

        class Builtin(torch.nn.Module):
            forward = torch.tanh

        class HalfBuilt(torch.nn.Module):
            def __init__(self):
                raise RuntimeError("fails before Module.__init__")

        try:
            HalfBuilt()
        except RuntimeError as exc:
            kept = exc  # its traceback keeps the half-built module alive, as a notebook's last error does
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), Static(), Builtin(), torch.nn.Linear(8, 1))
        return model, kept


def sam_like_train(torch, model, steps: int):
    """The optimizer steps under no_grad and inference_mode, as SAM-style wrappers and some loops do."""
    return train(torch, model, steps, step_context=lambda i: torch.no_grad() if i % 2 else torch.inference_mode())


def test_odd_programs_run_on_unharmed(at, torch):
    """No-grad optimizer steps, static/builtin forwards, a half-built module: same losses, no warning."""
    model, _kept = Odd.models(torch)
    plain = sam_like_train(torch, model, 6)
    model, _kept = Odd.models(torch)
    at.install(enabled="1", budget_pct=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = sam_like_train(torch, model, 6)
    assert traced == plain
    assert not [str(w.message) for w in caught if "nvtx_autotrace" in str(w.message)]
    rec = record_of(at.recorder)
    assert rec["modules_ranged"] == 3  # the Sequential and its two Linears; Static and Builtin are left alone
    assert {"forward 0 (Linear)", "backward 3 (Linear)"} <= set(module_names(at.recorder))


def test_jit_script_and_a_new_model_after_the_first(at, torch):
    at.install(enabled="1", budget_pct=100)
    model = tiny(torch)
    train(torch, model, 5)
    scripted = torch.jit.script(torch.nn.Linear(2, 2))  # a wrapped class: TorchScript reads its real source
    assert scripted(torch.ones(1, 2)).shape == (1, 2)
    plain_linear_forward = torch.nn.Linear.forward.__wrapped__
    del model
    import gc

    gc.collect()
    train(torch, tiny(torch), 1)  # the next boundary drops the dead model's slots and unwraps its classes
    assert torch.nn.Linear.forward is plain_linear_forward


def test_each_ranged_module_notes_the_line_that_called_it_once_for_the_settings_record(at, torch):
    """Issue 43, item 4: a ranged module's first call notes the line that called it (the first frame outside torch
    and nvtx_autotrace: a Sequential's children are called by torch, so their line is the Sequential's caller's);
    the settings record carries them, and uninstall forgets them. Lines checked against the program's source."""
    import os

    import cpu_train

    from nvtx_autotrace import settings, sites

    at.install(enabled="1", budget_pct=100)
    train(torch, tiny(torch), 5)
    source = Path(cpu_train.__file__)

    def line_of(text: str) -> str:
        n = next(n for n, line in enumerate(source.read_text().splitlines(), 1) if text in line)
        return f"{os.path.relpath(source)}:{n}"

    got = sites.module_sites()
    assert len(got) == 12, got  # every ranged module (TinyNet: 12), each once
    root_call = line_of("return self.head(self.blocks(F.relu(self.stem(x))))")
    assert got["stem (Linear)"] == got["blocks (Sequential)"] == got["head (Linear)"] == root_call
    assert got["blocks.0 (Block)"] == got["blocks.1 (Block)"] == root_call  # called by Sequential, in torch
    assert got["blocks.0.fc1 (Linear)"] == got["blocks.1.fc2 (Linear)"] == line_of("return x + self.fc2(self.act(")
    train_line = next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                      if "loss = run(x).square().mean()" in line)
    assert got["(TinyNet)"] == f"{os.path.relpath(__file__)}:{train_line}"
    assert settings.read_dynamic()["module_sites"] == got
    at.uninstall()
    assert sites.module_sites() == {} and "module_sites" not in settings.read_dynamic()
