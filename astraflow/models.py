"""Tiny causal LMs and the project's own tokenizer, shared by workers and trainers.

Both sides must start from bit-identical weights, so the model is built from a seeded config and
saved once (`init_checkpoint`); everything else loads that directory with plain `transformers`.
torch and transformers are imported inside the functions: `import astraflow` stays light.
"""

from __future__ import annotations

import shutil
import string
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from astraflow.config.models import ModelSpec, TokenizerSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
BASE_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def build_tokenizer(spec: TokenizerSpec | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer in the transformers format (loads with AutoTokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = spec or TokenizerSpec()
    alphabet = list(dict.fromkeys(BASE_ALPHABET + spec.extra_chars))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *alphabet])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def build_config(spec: ModelSpec, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    cls = Qwen2Config if spec.architecture == "qwen2" else LlamaConfig
    config = cls(**common)
    config.rope_theta = spec.rope_theta
    return config


def build_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast | None = None) -> PreTrainedModel:
    """A freshly initialised tiny model (float32), identical for identical specs."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer or build_tokenizer(spec.tokenizer)
    config = build_config(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id,
                          tokenizer.eos_token_id)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def init_checkpoint(spec: ModelSpec, out_dir: str | Path) -> Path:
    """Write the initial model and tokenizer to `out_dir` (or return `spec.path` for real
    checkpoints). Idempotent: an existing checkpoint is left alone."""
    if spec.path is not None:
        return Path(spec.path)
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tokenizer = build_tokenizer(spec.tokenizer)
    model = build_model(spec, tokenizer)
    # Several processes may initialise the same directory at once: each writes a private copy and
    # the first rename wins; the others find the finished checkpoint and drop theirs.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    return cast("PreTrainedTokenizerFast", AutoTokenizer.from_pretrained(str(path)))


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """Load a checkpoint directory with plain transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return cast("PreTrainedModel", model.to(device))  # type: ignore[arg-type]
