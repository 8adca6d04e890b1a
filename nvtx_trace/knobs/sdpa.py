"""Fused attention (scaled_dot_product_attention, flash) where the model writes softmax between two matmuls."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "sdpa", bool, "fused attention through the program's own option (--flash, attn_implementation=sdpa); nvtx_autotrace "
    "cannot rewrite hand-written attention", applied="option", area="attention", order=150, loss_bound=0.02, numerics=True,
    fixes=("manual_attention",),
    pytorch=template("y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # instead of "
                     "softmax(q @ k.T) @ v"),
    frameworks={"hf_trainer": 'AutoModelForCausalLM.from_pretrained(..., attn_implementation="sdpa")'},
    option_words=("flash", "flash_attn", "flash_attention", "use_flash_attn", "use_flash_attention", "sdpa",
                  "fused_attn"),
    option_choosers=("attn", "attention", "attn_impl", "attn_implementation", "attention_impl"))
