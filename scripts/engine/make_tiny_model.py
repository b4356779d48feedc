"""Make a tiny random-weight Llama and a locally trained tokenizer, as a Hugging Face model dir.

Run it with the engine venv's python (it needs torch, transformers and tokenizers):

    $ENGINE_VENV/bin/python scripts/engine/make_tiny_model.py [--out-root DIR]

Nothing is downloaded. Everything is made from fixed seeds, so the same script makes the same
model. The model dir is keyed by a hash of this file:
``<out-root>/tiny-llama-<sha256(this file)[:12]>/``, with out-root defaulting to
``${LLMCAP_ENGINE_HOME:-${XDG_CACHE_HOME:-~/.cache}/llmcap/engine}/models``. A second run finds
the finished dir and does nothing. The dir's path is the last line printed on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
ARCH = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
# Enough for /v1/chat/completions to work; the model itself is random noise.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DONE_MARKER = ".llmcap-model-complete"


def log(msg: str) -> None:
    print(f"[engine/make_tiny_model] {msg}", file=sys.stderr, flush=True)


def default_out_root() -> Path:
    home = os.environ.get("LLMCAP_ENGINE_HOME")
    if home:
        return Path(home) / "models"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "llmcap" / "engine" / "models"


def script_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def corpus(n_lines: int = 20000) -> list[str]:
    """Pseudo-English made from seeded syllables, digits and punctuation."""
    rng = random.Random(SEED)
    onsets = [
        "",
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "j",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "st",
        "tr",
        "pl",
        "gr",
        "sh",
        "ch",
        "th",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
    lexicon = []
    for _ in range(3000):
        k = rng.choice([1, 1, 2, 2, 2, 3, 3, 4])
        lexicon.append("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(k)))
    weights = [1.0 / (i + 1) for i in range(len(lexicon))]  # Zipf-like
    lines = []
    for _ in range(n_lines):
        words = rng.choices(lexicon, weights=weights, k=rng.randint(4, 18))
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        s = " ".join(words)
        lines.append(s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!", ","]))
    return lines


def make_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=ARCH["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_model(out: Path, tokenizer) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **ARCH,
    )
    config.dtype = "bfloat16"
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out)
    return {"parameters": sum(p.numel() for p in model.parameters())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-root", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="remake even if the dir exists")
    args = ap.parse_args()

    root = (args.out_root or default_out_root()).expanduser().resolve()
    final = root / f"tiny-llama-{script_hash()}"
    if (final / DONE_MARKER).is_file() and not args.force:
        log(f"model already made: {final}")
        print(final)
        return 0

    t0 = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=root))
    tmp.chmod(0o755)
    try:
        log(f"training a {VOCAB_SIZE}-token byte-level BPE tokenizer on seeded text")
        tokenizer = make_tokenizer(tmp)
        log("making a random-weight Llama " + json.dumps(ARCH))
        info = make_model(tmp, tokenizer)
        info.update(
            script_sha256_12=script_hash(),
            seed=SEED,
            vocab_size=len(tokenizer),
            seconds=round(time.monotonic() - t0, 2),
            files=sorted(p.name for p in tmp.iterdir()),
        )
        (tmp / DONE_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"made {final} ({info['parameters']:,} parameters) in {info['seconds']} s")
    print(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
