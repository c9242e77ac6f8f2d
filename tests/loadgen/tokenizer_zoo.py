"""Differently behaving `tokenizers` tokenizers, trained here on a few sentences (nothing is
downloaded), for tests that must hold for any tokenizer, not only the emulator's word-level one.

- byte_bpe: byte-level BPE (GPT-2 / Llama 3 style) with a small vocabulary, so the prompt
  builder's filler words are ~3 tokens each; BOS added to a raw prompt, as Llama 3 does.
- wordpiece: BERT-style WordPiece over whitespace/punctuation words, `##` continuations; no BOS.
- unigram: SentencePiece-style Unigram with a Metaspace pre-tokenizer (Llama 2 style); BOS added.
- chars: one token per character (byte-level alphabet, no merges); BOS added.

Each knows the manifest's special tokens (BOS, EOT, the header markers) as single tokens.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
BOS = SPECIALS[0]
KINDS = ("byte_bpe", "wordpiece", "unigram", "chars")

_CORPUS = [
    "A serving fleet answers requests while the queue grows and the batch shrinks.",
    "Latency is measured per token; cost is counted per million successful tokens.",
    "The river runs north past the stone field, under a green and blue cloud.",
    "Inference on an accelerator is bound by memory bandwidth when decoding one token.",
    "We replay the trace open loop: every request is sent at its scheduled time.",
    "user assistant system: 0123456789 , . ; ! ? ( ) - the of and to in a is",
]


def _bos_after(tok: Tokenizer) -> None:
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])


def build(kind: str) -> Tokenizer:
    corpus = _CORPUS * 20
    if kind == "byte_bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=330, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(corpus, trainer)
        _bos_after(tok)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=160, special_tokens=["[UNK]", *SPECIALS]))
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(
            corpus, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", *SPECIALS], unk_token="<unk>")
        )
        _bos_after(tok)
    elif kind == "chars":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        # No merges: the vocabulary is the byte alphabet itself.
        trainer = trainers.BpeTrainer(
            vocab_size=len(alphabet) + len(SPECIALS), special_tokens=SPECIALS, initial_alphabet=alphabet
        )
        tok.train_from_iterator(corpus, trainer)
        _bos_after(tok)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.add_special_tokens(SPECIALS)
    return tok


def save(kind: str, path: Path) -> Path:
    build(kind).save(str(path))
    return path
