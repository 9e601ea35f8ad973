"""Write the tiny local model vLLM serves in the game days: no download, nothing from a hub.

    .venv-vllm/bin/python gameday/tiny_model.py OUT_DIR TEXT_FILE...

A random Llama written with transformers (2 layers, hidden 256, 4 heads, 2 KV heads, about 3M
parameters, float32) and a byte-level BPE tokenizer trained here with `tokenizers` on the given
text files (the repository's own docs), with a ChatML chat template. Its answers are noise, which
is all a game day needs: lengths are set by max_tokens with ignore_eos. The folder is a standard
Hugging Face model folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json),
so llama.cpp's converter reads it too.

Runs in vLLM's own venv (transformers and tokenizers come with vLLM); it imports nothing from this
project. The same inputs give the same folder: seeds are fixed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_SIZE = 4096
MAX_POSITIONS = 2048
SEED = 20261201
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen2 ships it; the answer ends with <|im_end|>, which is also the eos token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_model(out_dir: Path, text_files: list[Path]) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [p.read_text(errors="replace") for p in sorted(text_files)]
    if not any(t.strip() for t in texts):
        raise SystemExit("tiny_model: the text files given to train the tokenizer are empty")
    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(texts), bos_token="<s>", eos_token="<|im_end|>",
                                   unk_token="<unk>", pad_token="</s>", model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=256, intermediate_size=688, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    return {"dir": str(out_dir), "parameters": params, "vocab_size": len(fast)}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: tiny_model.py OUT_DIR TEXT_FILE...", file=sys.stderr)
        return 2
    files = [Path(a) for a in argv[1:]]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        print(f"tiny_model: no such text file: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(json.dumps(write_model(Path(argv[0]), files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
