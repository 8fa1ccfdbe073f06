"""Local Hugging Face checkpoints on the ring (model = "hf:PATH"): split by decoder layer across the stages.

`agents.hf.checkpoint` reads a checkpoint directory without torch (config.json, the safetensors headers, the
tokenizer), so the launcher, the CLI and the summaries can check and describe it; `agents.hf.model` computes with
it (torch and the families' layers, `agents.hf.layers`), in the agents only; transformers builds test checkpoints
(`agents.hf.build`) and is never imported by an agent.
"""

from agents.hf.checkpoint import HF_PREFIX, Checkpoint, is_hf

__all__ = ["HF_PREFIX", "Checkpoint", "is_hf"]
