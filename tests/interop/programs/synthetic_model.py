"""A tiny synthetic model directory and the deterministic "policy" the scripted worker runs.

Pure standard library: the worker imports it under .venv-dynamo and the tests import it under the
product venv, so both sides agree on which token ids a given weight version must produce.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

VOCAB_SIZE = 512
BOS_ID = 1
EOS_ID = 2
# Ids 0-2 are special; generated ids stay in [FIRST_WORD_ID, VOCAB_SIZE) so that the
# frontend's detokenizer always finds them in the vocabulary.
FIRST_WORD_ID = 3
SYNTHETIC_LOGPROB = -0.25


def policy_tokens(version: Any, prompt_token_ids: list[int], count: int) -> list[int]:
    """The ids a worker holding `version` emits for `prompt_token_ids`.

    The whole point of the interop generation check is that tokens change when the weight
    version changes, so the version (as canonical JSON) seeds the sequence.
    """
    seed = zlib.crc32(json.dumps(version, sort_keys=True).encode())
    seed = zlib.crc32(json.dumps(prompt_token_ids).encode(), seed)
    span = VOCAB_SIZE - FIRST_WORD_ID
    return [FIRST_WORD_ID + (seed + 7919 * i) % span for i in range(count)]


def write_model_dir(path: Path) -> Path:
    """Write config.json + tokenizer.json (+ tokenizer_config.json) for a word-level vocab.

    Dynamo's register_model reads these from a local directory (no hub access) to build the
    model card the frontend uses for tokenization and detokenization.

    Replicas of one model must register the *same* directory: the card's checksum (`mdcsum`)
    hashes the directory path (`source_path`) with the files' checksums, and the 1.6.1
    frontend keeps only the first checksum it sees per model and worker set, rejecting the
    other replicas ("Rejected incompatible workers"). Several processes may therefore write
    here at once; each file is replaced atomically with identical content, so a reader never
    sees a partial file.
    """
    path.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(FIRST_WORD_ID, VOCAB_SIZE):
        vocab[f"w{i}"] = i
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "max_position_embeddings": 2048,
        "hidden_size": 16,
        "num_attention_heads": 1,
        "num_hidden_layers": 1,
        "torch_dtype": "float32",
    }
    tokenizer_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    _write_atomically(path / "tokenizer.json", json.dumps(tokenizer))
    _write_atomically(path / "config.json", json.dumps(config))
    _write_atomically(path / "tokenizer_config.json", json.dumps(tokenizer_config))
    return path


def _write_atomically(target: Path, text: str) -> None:
    scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    scratch.write_text(text)
    os.replace(scratch, target)
