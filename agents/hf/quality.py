"""A checkpoint pair's quality table: the draft's alpha-hat against the target on held-out text (agents.zoo.train
--model hf:PATH --draft hf:PATH), as agents.zoo.train prints it for the byte models."""

from __future__ import annotations

import torch

from agents.zoo.measure import ALPHA_WINDOWS, acceptance
from testbed.core.errors import ConfigError


def checkpoint_acceptance(target_name: str, draft_name: str, n_windows: int = ALPHA_WINDOWS,
                          window_tokens: int = 128, temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)) -> dict[float, float]:
    """alpha-hat of a draft checkpoint against a target checkpoint ("hf:PATH" each), on the held-out corpus text
    tokenized by the target's tokenizer: {temperature: alpha-hat}."""
    from agents.zoo.corpus import build_corpus
    from agents.hf.model import load_hf

    target, draft = load_hf(target_name), load_hf(draft_name)
    if target.vocabulary.vocab != draft.vocabulary.vocab or target.config.vocab_size != draft.config.vocab_size:
        raise ConfigError("the draft's tokenizer is not the target's: alpha-hat compares their distributions "
                          "token for token", source=draft_name)
    for model in (target, draft):
        model.load(0, model.config.n_layer, entry=True)
    ids = torch.tensor(target.vocabulary.encode(build_corpus().val.decode("utf-8", errors="replace")))
    seq = min(window_tokens, target.config.block_size - 1, draft.config.block_size - 1)
    starts = torch.linspace(0, len(ids) - seq - 1, n_windows).long()  # [N]
    windows = ids[starts[:, None] + torch.arange(seq + 1)]  # [N, seq+1]
    with torch.inference_mode():
        return {t: acceptance(target, draft, windows, t) for t in temperatures}


def checkpoint_report(target: str | None, draft: str | None) -> int:
    """Print the pair's alpha-hat; 2 with one line on bad input."""
    from agents.hf.checkpoint import is_hf

    if not (target and draft and is_hf(target) and is_hf(draft)):
        print("error: --model hf:PATH and --draft hf:PATH go together (local checkpoints)")
        return 2
    try:
        alpha = checkpoint_acceptance(target, draft)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    print(f"draft {draft} against target {target}, {ALPHA_WINDOWS} held-out windows in the target's tokens")
    for temperature, value in alpha.items():
        print(f"  alpha-hat at T = {temperature:g}: {value:.3f}" + ("  (argmax agreement)" if temperature == 0 else ""))
    return 0
