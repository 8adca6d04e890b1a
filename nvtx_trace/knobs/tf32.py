"""TF32 tensor cores for fp32 matrix math (matmuls and cuDNN convolutions)."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "tf32", bool, "TF32 tensor cores for fp32 matmuls and convolutions", applied="backend", area="math", order=50,
    backend=("backends.cuda.matmul.allow_tf32", "backends.cudnn.allow_tf32"),
    loss_bound=0.01, numerics=True, fixes=("precision",),
    pytorch=template("torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.allow_tf32 = True"),
    frameworks={"hf_trainer": "TrainingArguments(..., tf32=True)",
                "lightning": 'torch.set_float32_matmul_precision("high")  # before trainer.fit'},
    option_words=("tf32", "allow-tf32", "allow_tf32", "tensorcores", "tensor_cores"),
    precision=lambda value: "tf32" if value else None)
