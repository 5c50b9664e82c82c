"""Tiny causal LMs and the project's own tokenizer, shared by workers and trainers.

Both sides must start from bit-identical weights, so the model is built from a seeded config and
saved once (`init_checkpoint`); everything else loads that directory with plain `transformers`.
torch and transformers are imported inside the functions: `import astraflow` stays light.
"""

from __future__ import annotations

import shutil
import string
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from astraflow.config.models import ModelSpec, TokenizerSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = SPECIAL_TOKENS
BASE_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


#: Qwen2's pre-tokenizer split (transformers rebuilds it for qwen2 checkpoints, see build_tokenizer).
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _byte_map() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_BYTE_MAP = _byte_map()


def build_tokenizer(spec: TokenizerSpec | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer in the transformers format.

    One token per character of the alphabet, written as a byte-level BPE without merges, with the
    same normaliser, pre-tokenizer and decoder as Qwen2's tokenizer. Why: for qwen2 checkpoints
    transformers 5's AutoTokenizer ignores tokenizer.json's pipeline and rebuilds Qwen2Tokenizer
    from the vocabulary; with this layout the rebuilt tokenizer gives the same ids, so AutoTokenizer,
    PreTrainedTokenizerFast and SGLang all agree, for Qwen2 and Llama checkpoints alike.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = spec or TokenizerSpec()
    alphabet = list(
        dict.fromkeys((BASE_ALPHABET if spec.alphabet is None else spec.alphabet) + spec.extra_chars)
    )
    too_wide = [c for c in alphabet if len(c.encode()) != 1]
    if too_wide:
        raise ValueError(
            f"tokenizer.alphabet and extra_chars must be single-byte (ASCII) characters, got {too_wide}"
        )
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *(_BYTE_MAP[ord(c)] for c in alphabet)])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
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
    config = build_config(
        spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
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
    if _complete(out):
        return out
    if _distributed_rank() > 0:
        # transformers writes model files on rank 0 only: the other ranks wait for its checkpoint.
        deadline = time.monotonic() + 600
        while not _complete(out):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {_distributed_rank()}: no complete initial checkpoint in {out} after 600s"
                )
            time.sleep(0.2)
        return out
    tokenizer = build_tokenizer(spec.tokenizer)
    model = build_model(spec, tokenizer)
    # Several processes may initialise the same directory at once: each writes a private copy and
    # the first rename wins; the others find the finished checkpoint and drop theirs.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not _complete(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"saving the initial checkpoint left an incomplete directory under {out.parent}")
    try:
        tmp.rename(out)
    except OSError:
        if not _complete(out):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _distributed_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _complete(path: Path) -> bool:
    """A checkpoint directory with its config, tokenizer and weights (not a half-written one)."""
    return (
        (path / "config.json").exists()
        and (path / "tokenizer.json").exists()
        and any(path.glob("*.safetensors"))
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    return cast("PreTrainedTokenizerFast", AutoTokenizer.from_pretrained(str(path)))


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """Load a checkpoint directory with plain transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return cast("PreTrainedModel", model.to(device))  # type: ignore[arg-type]
