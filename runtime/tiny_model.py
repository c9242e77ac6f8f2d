"""A tiny Llama-architecture checkpoint for running a real serving engine on this machine's CPU.

`python -m runtime.tiny_model --out DIR` writes, with nothing downloaded:
- `tokenizer.json`: a byte-level BPE trained here (the `tokenizers` package) on a fixed
  corpus, with Llama 3's special tokens and a post-processor that puts BOS before a raw prompt;
- `tokenizer_config.json` and `chat_template.jinja`: what transformers (and so vLLM) loads;
  the template is `CHAT_TEMPLATE`. The real-engine manifest pins these three files' sha256
  (tokenizer.files) and reads its chat template from the .jinja;
- `config.json`, `generation_config.json`;
- `model.safetensors`: random float32 weights (2 layers, hidden 256, 4 query / 2 KV heads),
  drawn from a seeded `random.Random`, so the same bytes (and sha256) on every machine.

The weights are noise: the model exists to exercise a real engine's scheduler, tokenizer,
streaming and metrics, not to answer anything. The layout and tensor names are those of
transformers' LlamaForCausalLM (`model.layers.N.self_attn.q_proj.weight`, ...), which vLLM's
Llama loader reads.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from core.manifest import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, file_sha256
from core.tokenizer import VOCAB

SEED = 20261203
BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = (BOS, EOS, HEADER_START, HEADER_END, EOT)
# What the real-engine manifest pins as tokenizer.files (the server reads its template from the .jinja).
TOKENIZER_FILES = ("tokenizer.json", TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE)

# Llama 3's layout with this checkpoint's own special-token names (transformers passes
# bos_token / eos_token to the template).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    layers: int = 2
    hidden: int = 256
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 1024  # BPE merges fill it up to this size
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _corpus() -> list[str]:
    """Fixed training text: the prompt builder's word pool in seeded orders (so each pool word
    ends up a token of its own after a space, as common words are in a real BPE), plus numbers
    and punctuation so the byte-level alphabet is exercised."""
    rng = random.Random(SEED)
    lines = [" ".join(rng.choices(VOCAB, k=64)) for _ in range(400)]
    lines += [" ".join(str(rng.randrange(10_000)) for _ in range(32)) + " , . ; : ! ?" for _ in range(50)]
    return lines


def build_tokenizer(shape: Shape) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, _special_id(tok, BOS))]
    )
    return tok


def _tensor(rng: random.Random, n: int, std: float) -> bytes:
    return array("f", (rng.gauss(0.0, std) for _ in range(n))).tobytes()


def _ones(n: int) -> bytes:
    return array("f", [1.0] * n).tobytes()


def _tensors(shape: Shape, vocab: int) -> list[tuple[str, list[int], bytes]]:
    rng = random.Random(SEED)
    h, i, d = shape.hidden, shape.intermediate, shape.head_dim
    std = 0.02  # transformers' default initializer_range for Llama
    out: list[tuple[str, list[int], bytes]] = [("model.embed_tokens.weight", [vocab, h], _tensor(rng, vocab * h, std))]
    for n in range(shape.layers):
        p = f"model.layers.{n}."
        for name, rows, cols in (
            ("self_attn.q_proj", shape.heads * d, h),
            ("self_attn.k_proj", shape.kv_heads * d, h),
            ("self_attn.v_proj", shape.kv_heads * d, h),
            ("self_attn.o_proj", h, shape.heads * d),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ):
            out.append((f"{p}{name}.weight", [rows, cols], _tensor(rng, rows * cols, std)))
        out.append((f"{p}input_layernorm.weight", [h], _ones(h)))
        out.append((f"{p}post_attention_layernorm.weight", [h], _ones(h)))
    out.append(("model.norm.weight", [h], _ones(h)))
    out.append(("lm_head.weight", [vocab, h], _tensor(rng, vocab * h, std)))
    return out


def write_safetensors(path: Path, tensors: list[tuple[str, list[int], bytes]]) -> None:
    """The safetensors layout: an 8-byte little-endian header length, a JSON header naming
    each tensor's dtype, shape and byte range, then the raw little-endian data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims, data in tensors:
        header[name] = {"dtype": "F32", "shape": dims, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    if sys.byteorder != "little":
        raise RuntimeError("safetensors stores little-endian data; this writer assumes a little-endian host")
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for _, _, data in tensors:
            fh.write(data)


def write_tokenizer(out: Path, shape: Shape = Shape()) -> Tokenizer:
    """The tokenizer files (TOKENIZER_FILES) into `out`: the same bytes on every run, so the
    real-engine manifest pins their sha256 (tests/runtime/test_tiny_model.py checks the pins).
    Checked 2026-12-05 with tokenizers 0.23.3 (requirements-runtime.txt): identical across
    processes, RAYON_NUM_THREADS 1 and 2, TOKENIZERS_PARALLELISM off and PYTHONHASHSEED."""
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(shape)
    tok.save(str(out / "tokenizer.json"))
    (out / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE)
    _write_json(
        out / TOKENIZER_CONFIG,
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOT,
            "model_max_length": shape.max_positions,
            "clean_up_tokenization_spaces": False,
        },
    )
    return tok


def generate(out: Path, shape: Shape = Shape()) -> dict[str, str]:
    """Write the checkpoint into `out`; return {file name: sha256}."""
    tok = write_tokenizer(out, shape)
    vocab = int(tok.get_vocab_size())
    bos_id, eos_id, eot_id = (_special_id(tok, t) for t in (BOS, EOS, EOT))
    _write_json(
        out / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "vocab_size": vocab,
            "max_position_embeddings": shape.max_positions,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "bos_token_id": bos_id,
            "eos_token_id": [eos_id, eot_id],
        },
    )
    _write_json(out / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": [eos_id, eot_id]})
    write_safetensors(out / "model.safetensors", _tensors(shape, vocab))
    return {p.name: file_sha256(p) for p in sorted(out.iterdir()) if p.is_file()}


def _special_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise RuntimeError(f"the trained tokenizer lost special token {token!r}")
    return i


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m runtime.tiny_model", description=__doc__.splitlines()[0] if __doc__ else None
    )
    ap.add_argument("--out", required=True, help="directory to write the checkpoint into")
    a = ap.parse_args(argv)
    for name, digest in generate(Path(a.out)).items():
        print(f"{digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
