"""torch.compile: fused kernels for the model's forward and backward; reduce-overhead replays them as CUDA graphs."""

from nvtx_trace.knobs.knob import Knob

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _mode(value) -> str:
    return f', mode="{value}"' if isinstance(value, str) and value != "default" else ""


def _lines(value, where: dict) -> list[str]:
    return [f"model = torch.compile(model{_mode(value)})  # after moving it to the GPU, before the loop"]


def _hf(value) -> str:
    mode = f', torch_compile_mode="{value}"' if isinstance(value, str) and value != "default" else ""
    return f"TrainingArguments(..., torch_compile=True{mode})"


def _lightning(value) -> str:
    return f"model = torch.compile(model{_mode(value)})  # the LightningModule, before trainer.fit(model)"


KNOB = Knob(
    "compile", bool, "model.compile() (or a mode: compile=reduce-overhead) on the models the optimizer trains",
    applied="model", area="graph", order=100, choices={m: m for m in MODES}, choices_are="a mode", loss_bound=0.01,
    numerics=True, fixes=("fusion", "cpu_overhead", "cuda_api"), pytorch=_lines,
    frameworks={"hf_trainer": _hf, "lightning": _lightning},
    option_words=("compile", "torch-compile", "torch_compile", "torch_compile_mode", "compile_mode"))
