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
