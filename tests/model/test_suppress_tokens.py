"""generation_config.json's suppress_tokens are never sampled; the builtin's noise is printable ASCII."""

import json
import shutil

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.sampling import SamplingParams
from engine.errors import ModelLoadError
from engine.model.builtin import BUILTIN_SUPPRESS_TOKEN_IDS
from tests.model.conftest import load

SEEDS = range(4)


@pytest.fixture(autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def generate(loaded, params: list[SamplingParams], prompt: list[int]) -> dict[str, list]:
    """request id -> [token ids, text deltas (one per output), finish reason]."""
    engine = LLMEngine(EngineConfig(kv_cache_memory=16 << 20, max_model_len=256), loaded=loaded)
    for i, p in enumerate(params):
        engine.add_request(str(i), prompt, p)
    results: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            entry = results.setdefault(out.request_id, [[], [], None])
            entry[0].extend(out.new_token_ids)
            entry[1].append(out.new_text)
            entry[2] = out.finish_reason
    return results


def run_modes(loaded, prompt: list[int]) -> tuple[list[int], list[list[int]]]:
    """Greedy tokens, and the tokens of a few seeded temperature-1 requests."""
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)]
    params += [SamplingParams(max_tokens=24, temperature=1.0, seed=s, ignore_eos=True) for s in SEEDS]
    results = generate(loaded, params, prompt)
    return results["0"][0], [results[str(i + 1)][0] for i in SEEDS]


@pytest.fixture(scope="module")
def suppressed_ckpt(llama_ckpt, tmp_path_factory):
    """A copy of the tiny Llama whose generation_config.json suppresses every token it chose unsuppressed."""
    folder = tmp_path_factory.mktemp("suppressed") / "ckpt"
    shutil.copytree(llama_ckpt[0], folder)
    plain = load(folder)
    assert plain.suppress_token_ids == []  # transformers wrote a generation_config.json without the key
    prompt = plain.tokenizer.encode("Paged attention reads keys")
    greedy, sampled = run_modes(plain, prompt)
    eos_ids = {plain.model_config.eos_token_id, plain.tokenizer.eos_token_id}
    chosen = (set(greedy) | {t for tokens in sampled for t in tokens}) - eos_ids
    gen_path = folder / "generation_config.json"
    gen_config = json.loads(gen_path.read_text())
    gen_path.write_text(json.dumps(dict(gen_config, suppress_tokens=sorted(chosen | eos_ids))))
    return folder, prompt, greedy, sampled, chosen, eos_ids


def test_loader_reads_suppress_tokens_but_never_eos(suppressed_ckpt):
    folder, _, _, _, chosen, eos_ids = suppressed_ckpt
    loaded = load(folder)
    assert loaded.suppress_token_ids == sorted(chosen)
    assert not eos_ids & set(loaded.suppress_token_ids)


def test_suppressed_tokens_are_never_sampled(suppressed_ckpt):
    folder, prompt, greedy, sampled, chosen, _ = suppressed_ckpt
    assert greedy[0] in chosen and len(chosen) < 150  # the unsuppressed greedy choice is suppressed
    greedy_after, sampled_after = run_modes(load(folder), prompt)
    assert greedy_after[0] != greedy[0]
    assert not chosen & set(greedy_after)
    for before, after in zip(sampled, sampled_after, strict=True):
        assert len(after) == 24 and after != before and not chosen & set(after)


@pytest.mark.parametrize("gen_config", [{"suppress_tokens": [1, 300]}, {"suppress_tokens": [True]},
                                        {"suppress_tokens": "5"}])
def test_bad_suppress_tokens_fail_the_load(llama_ckpt, tmp_path, gen_config):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_ckpt[0], folder)
    (folder / "generation_config.json").write_text(json.dumps(gen_config))
    with pytest.raises(ModelLoadError, match=r"suppress_tokens must be a list of token ids in 0\.\.299"):
        load(folder)


def test_no_generation_config_suppresses_nothing(llama_ckpt, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_ckpt[0], folder)
    (folder / "generation_config.json").unlink()
    assert load(folder).suppress_token_ids == []


def test_builtin_suppresses_all_but_printable_ascii_newline_and_eos(builtin):
    allowed = set(range(builtin.model_config.vocab_size)) - set(builtin.suppress_token_ids)
    assert builtin.suppress_token_ids == BUILTIN_SUPPRESS_TOKEN_IDS
    assert allowed == set(range(0x20, 0x7F)) | {0x0A, builtin.tokenizer.eos_token_id}


def test_builtin_noise_is_printable_ascii_one_delta_per_token(builtin):
    """No token is held back as partial UTF-8: each streamed delta is the text of exactly one token."""
    tok = builtin.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Grüße, write me some noise"}]))
    params = [SamplingParams(max_tokens=64, temperature=1.0, seed=s) for s in range(8)]
    params.append(SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=99))
    results = generate(builtin, params, prompt)
    num_tokens = 0
    for tokens, deltas, reason in results.values():
        if tokens[-1] == tok.eos_token_id:  # the stop token adds no text
            assert reason == "stop"
            tokens, deltas = tokens[:-1], deltas[:-1]
        assert sum(1 for d in deltas if d) == len(tokens) and all(len(d) == 1 for d in deltas)
        assert all(d == "\n" or " " <= d <= "~" for d in deltas)
        assert "".join(deltas) == bytes(tokens).decode("ascii")
        num_tokens += len(tokens)
    assert num_tokens >= 300
