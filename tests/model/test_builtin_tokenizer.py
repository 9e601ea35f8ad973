"""The builtin model is deterministic; byte and Hugging Face tokenizers encode, decode and chat."""

import json

import pytest
import torch

from engine.core.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.model.builtin import BUILTIN_CONFIG
from engine.model.loader import load_model
from engine.model.tokenizer import ByteTokenizer, HFTokenizer
from tests.model.conftest import write_tokenizer


def test_builtin_is_deterministic_across_loads(builtin):
    again = load_model(EngineConfig())
    assert again.digest == builtin.digest and len(builtin.digest) == 12
    assert again.name == "builtin"
    ids = torch.tensor([builtin.tokenizer.encode("deterministic weights")])
    assert torch.equal(again.model.forward_full(ids), builtin.model.forward_full(ids))


def test_builtin_shape_and_size(builtin):
    cfg = builtin.model_config
    assert cfg == BUILTIN_CONFIG
    assert cfg.vocab_size == builtin.tokenizer.vocab_size == 260
    assert cfg.eos_token_id == builtin.tokenizer.eos_token_id == 257
    assert builtin.weights_bytes == sum(p.numel() * 4 for p in builtin.model.parameters())
    assert 25e6 < cfg.num_params() < 40e6  # memory-bound at batch 1 on a CPU
    assert cfg.kv_bytes_per_token(4) == 2 * 8 * 2 * 64 * 4


def test_builtin_noise_does_not_stop_at_once(builtin):
    """Sampled from the builtin's noise, eos is rare: generations run on."""
    ids = torch.tensor([builtin.tokenizer.encode("<|begin_of_text|>hello there, model")])
    logits = builtin.model.forward_full(ids)[0]  # [S, vocab]
    assert logits.softmax(-1)[:, 257].max() < 1 / 260
    suppressed = torch.tensor(builtin.suppress_token_ids)
    probs = logits.index_fill(-1, suppressed, float("-inf")).softmax(-1)  # what the sampler draws from
    assert probs[:, 257].max() < 1 / (260 - len(suppressed))  # below a uniform share


def test_builtin_bfloat16_weights_follow_the_same_seed(builtin):
    half = load_model(EngineConfig(dtype="bfloat16"))
    assert half.digest == builtin.digest  # digest names the weights recipe, not the dtype
    w32 = builtin.model.model.layers[3].mlp.up_proj.weight
    assert torch.equal(half.model.model.layers[3].mlp.up_proj.weight, w32.to(torch.bfloat16))


@pytest.mark.parametrize("text", ["", "plain ascii", "Grüße, 東京 🙂 \n\t", "<|im_start|> in text"])
def test_byte_tokenizer_round_trips_utf8(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_byte_tokenizer_specials():
    tok = ByteTokenizer()
    assert tok.encode("a<|im_end|>b") == [97, 259, 98]
    assert tok.decode([97, 259, 98]) == "ab"
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a cut multi-byte character decodes, replaced


def test_byte_chat_template():
    tok = ByteTokenizer()
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == (
        "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.encode(text)[:2] == [256, 258]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory) -> HFTokenizer:
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder)
    return HFTokenizer(folder)


def test_hf_tokenizer_round_trip_and_ids(hf_tokenizer):
    tok = hf_tokenizer
    assert tok.bos_token_id == 0 and tok.eos_token_id == 3 and tok.vocab_size == 300
    text = "Paged attention reads Grüße 🙂"
    ids = tok.encode(text)
    assert ids[0] == 0  # the post-processor's bos
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False) == "<s>" + text


def test_hf_chat_template_renders_and_gets_one_bos(hf_tokenizer):
    tok = hf_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "  Hello  "}])
    assert text == "<s><|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[:2] == [0, 2] and ids.count(0) == 1


def test_hf_chat_template_raise_exception_is_a_request_error(hf_tokenizer):
    with pytest.raises(InvalidRequestError, match="Unknown role: tool") as info:
        hf_tokenizer.apply_chat_template([{"role": "tool", "content": "x"}])
    assert info.value.param == "messages"


def test_hf_chat_template_from_named_list_and_missing(tmp_path):
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer(tmp_path).apply_chat_template([]) == "D<|im_end|>"
    generation = "{% for m in messages %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(generation)  # wins over tokenizer_config.json
    assert HFTokenizer(tmp_path).apply_chat_template([{"role": "assistant", "content": "ok"}]) == "[ok]"
    (tmp_path / "chat_template.jinja").unlink()
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequestError, match="no chat template"):
        HFTokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_hf_tokenizer_load_errors(tmp_path):
    from engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        HFTokenizer(tmp_path)
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template="{% for m in messages %}")))
    with pytest.raises(ModelLoadError, match="chat template has a syntax error at line 1"):
        HFTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    with pytest.raises(ModelLoadError, match="tokenizer.json: cannot load tokenizer"):
        HFTokenizer(tmp_path)


def test_a_lone_surrogate_is_an_invalid_request_not_a_crash(tmp_path):

    write_tokenizer(tmp_path)
    for tokenizer in (ByteTokenizer(), HFTokenizer(tmp_path)):
        with pytest.raises(InvalidRequestError, match="lone UTF-16 surrogate") as info:
            tokenizer.encode("half an emoji: \ud83d")
        assert info.value.param == "prompt"
        assert tokenizer.decode(tokenizer.encode("a whole one: \U0001f600")) == "a whole one: \U0001f600"
