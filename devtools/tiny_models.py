"""Tiny random Llama target/draft pairs with an offline tokenizer, for tests and the quick demo.

No model hub is needed: the tokenizer is a byte-level BPE trained on text shipped with Python
(the standard library's docstrings), and the weights are random. The target uses a larger init
than the default so that greedy decoding does not collapse onto one token; the draft is derived
from the target (same embeddings, first layers), which gave 36 % greedy agreement with the
4-layer target when measured.

``TinyPairSpec.model_vocab_size`` pads the models' vocabulary beyond the tokenizer's (for speed
benchmarks that need a real model's vocabulary size: the extra embedding and lm_head rows are
random like the rest, and the models may sample ids the tokenizer cannot decode, so generate
with ``detokenize=False``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

_CORPUS_MODULES = ("json", "pathlib", "argparse", "collections", "functools", "itertools",
                   "logging", "re", "string", "textwrap", "unittest", "dataclasses", "typing")


# A plain chat template so the OpenAI chat endpoint works with the tiny tokenizer.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@dataclass(frozen=True)
class TinyPairSpec:
    vocab_size: int = 384
    hidden_size: int = 128  # head_dim 32: the smallest head size CPU attention supports
    intermediate_size: int = 256
    target_layers: int = 4
    draft_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    init_std: float = 0.2
    draft_noise: float = 0.0  # std of noise added to the draft's copied weights (0.02 already
    # drops greedy agreement from 36 % to 17 %: these random nets are chaotic)
    seed: int = 0
    max_position_embeddings: int = 2048
    model_vocab_size: int | None = None  # the models' vocab_size (None: the tokenizer's size)

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes a token takes in the pair (target and draft layers, K and V, float32)."""
        head_dim = self.hidden_size // self.num_heads
        return (self.target_layers + self.draft_layers) * 2 * self.num_kv_heads * head_dim * 4

    def key(self) -> str:
        fields = asdict(self)
        if fields["model_vocab_size"] is None:  # keeps the keys of pairs built before the field
            del fields["model_vocab_size"]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def _corpus() -> list[str]:
    import importlib
    import inspect

    texts = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            if callable(obj):  # functions and classes (not deprecated alias modules)
                doc = inspect.getdoc(obj)
                if doc:
                    texts.append(doc)
    return texts


def build_tokenizer(vocab_size: int, out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer and save it in Hugging Face format to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def _llama_config(spec: TinyPairSpec, num_layers: int, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings, initializer_range=spec.init_std,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, torch_dtype="float32")


def build_tiny_pair(root: str | os.PathLike, spec: TinyPairSpec = TinyPairSpec()) -> tuple[Path, Path]:
    """Build (or reuse) ``root/<key>/target`` and ``root/<key>/draft``; returns their paths."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    final = Path(root) / f"tiny-llama-{spec.key()}"
    if (final / "DONE").exists():
        return final / "target", final / "draft"
    # Built in a private directory and renamed into place, so processes building the same pair
    # at once (parallel test workers, benchmark subprocesses) never read a half-written one.
    base = final.with_name(f"{final.name}.building-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    target_dir, draft_dir = base / "target", base / "draft"

    tok_dir = base / "tokenizer"
    build_tokenizer(spec.vocab_size, tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    vocab_size = len(tokenizer)
    if spec.model_vocab_size is not None:
        if spec.model_vocab_size < vocab_size:
            raise ValueError(f"model_vocab_size {spec.model_vocab_size} is below the "
                             f"tokenizer's {vocab_size}")
        vocab_size = spec.model_vocab_size

    torch.manual_seed(spec.seed)
    target = LlamaForCausalLM(_llama_config(spec, spec.target_layers, vocab_size)).float()
    draft = LlamaForCausalLM(_llama_config(spec, spec.draft_layers, vocab_size)).float()
    # The draft: the target's embeddings, first layers, final norm and head, plus noise.
    draft_state = {}
    for name, tensor in draft.state_dict().items():
        source = target.state_dict()[name]
        draft_state[name] = source + spec.draft_noise * torch.randn_like(source)
    draft.load_state_dict(draft_state)

    for model, path in ((target, target_dir), (draft, draft_dir)):
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
    (base / "DONE").write_text(json.dumps(asdict(spec), indent=2))
    try:
        base.rename(final)
    except OSError:  # another process finished first (or a stale unfinished copy is there)
        if not (final / "DONE").exists():
            shutil.rmtree(final)
            base.rename(final)
        else:
            shutil.rmtree(base)
    return final / "target", final / "draft"


def load_pair(target_dir: Path, draft_dir: Path):
    """Load a pair as eval-mode fp32 ``transformers`` models."""
    from transformers import AutoModelForCausalLM

    return tuple(AutoModelForCausalLM.from_pretrained(p, dtype="float32").eval()
                 for p in (target_dir, draft_dir))


def main(argv: list[str] | None = None) -> None:
    """Build (or reuse) the tiny pair under VLLM_MTAD_CACHE_DIR/tiny and print where it is."""
    import argparse

    from vllm_mtad import envs

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--env", action="store_true",
                        help="print shell assignments TARGET=... DRAFT=... (for eval)")
    args = parser.parse_args(argv)
    target, draft = build_tiny_pair(envs.cache_dir() / "tiny")
    if args.env:
        print(f"TARGET={target}\nDRAFT={draft}")
    else:
        print(f"target: {target}\ndraft:  {draft}")


if __name__ == "__main__":
    main()
