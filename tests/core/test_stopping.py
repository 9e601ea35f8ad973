"""Stop strings, stop token ids, eos and ignore_eos, max_tokens, and UTF-8-safe incremental text."""

from engine_rig import run_to_completion

from engine.core.detokenizer import detokenize_incrementally
from engine.core.outputs import FinishReason
from engine.core.sampling import SamplingParams
from engine.core.sequence import Request
from engine.model.tokenizer import ByteTokenizer

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]  # "Hello world"


def run(engine, params: SamplingParams):
    engine.add_request("a", PROMPT, params)
    tokens, text, final = run_to_completion(engine)["a"]
    return tokens, text, final


def reference(make_engine, max_tokens: int = 20):
    return run(make_engine(), SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def test_max_tokens_finishes_with_length(make_engine):
    tokens, _, final = reference(make_engine, max_tokens=5)
    assert len(tokens) == 5 and final.finish_reason is FinishReason.LENGTH and final.num_output_tokens == 5


def test_stop_token_id_stops_at_its_first_occurrence(make_engine):
    ref_tokens, _, _ = reference(make_engine)
    stop_id = ref_tokens[3]
    first = ref_tokens.index(stop_id)
    params = SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_id], ignore_eos=True)
    tokens, text, final = run(make_engine(), params)
    assert tokens == ref_tokens[: first + 1]  # the stop token is generated but adds no text
    assert final.finish_reason is FinishReason.STOP
    assert text == ByteTokenizer().decode(ref_tokens[:first])


def test_eos_stops_unless_ignore_eos(make_engine):
    ref_tokens, _, _ = reference(make_engine)
    eos = ref_tokens[4]
    engine = make_engine()
    engine.eos_token_id = eos  # make the model's 5th greedy token play the end of sequence
    tokens, _, final = run(engine, SamplingParams(max_tokens=20, temperature=0.0))
    assert tokens == ref_tokens[: ref_tokens.index(eos) + 1] and final.finish_reason is FinishReason.STOP
    engine = make_engine()
    engine.eos_token_id = eos
    tokens, _, final = run(engine, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert tokens == ref_tokens and final.finish_reason is FinishReason.LENGTH


def test_stop_string_is_cut_from_the_text_and_never_streamed(make_engine):
    ref_tokens, ref_text, _ = reference(make_engine)
    stop = ref_text[6:9]
    cut = ref_text.index(stop)
    params = SamplingParams(max_tokens=20, temperature=0.0, stop=[stop], ignore_eos=True)
    engine = make_engine()
    engine.add_request("a", PROMPT, params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [o.new_text for o in engine.step().outputs]
    assert "".join(deltas) == ref_text[:cut]
    assert all(stop not in "".join(deltas[: i + 1]) for i in range(len(deltas)))


def test_partial_utf8_is_held_back_until_the_character_is_whole():
    tokenizer = ByteTokenizer()
    request = Request("a", list(b"ab"), SamplingParams(), 0.0)
    deltas = []
    for byte in "é€!".encode():
        request.append_token(byte)
        deltas.append(detokenize_incrementally(tokenizer, request, request.num_tokens))
    assert deltas == ["", "é", "", "", "€", "!"]


def test_pending_partial_utf8_is_flushed_at_the_end():
    tokenizer = ByteTokenizer()
    request = Request("a", list(b"ab"), SamplingParams(), 0.0)
    request.append_token(0xE2)
    assert detokenize_incrementally(tokenizer, request, request.num_tokens) == ""
    assert detokenize_incrementally(tokenizer, request, request.num_tokens, flush=True) == "\ufffd"


def test_incremental_text_equals_the_full_decode_with_a_byte_level_bpe(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from engine.model.tokenizer import HFTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ["the cache hit rate fell", "naïve café — 東京 the rate", "p99 latency 🚀 rose"] * 20
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer(tmp_path)
    prompt = tokenizer.encode("the cache")
    text = " hit 東京 rose 🚀 naïve café"
    request = Request("a", prompt, SamplingParams(), 0.0)
    deltas = []
    for token in tokenizer.encode(text):
        request.append_token(token)
        deltas.append(detokenize_incrementally(tokenizer, request, request.num_tokens))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some character spans several tokens and was held back whole
