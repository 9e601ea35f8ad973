"""Token sampling from the last position's logits: suppressed ids, penalties and bias, greedy, temperature,
top-k, top-p, seeds; and the log-probabilities of what was chosen."""

import torch

from engine.core import logits_processors
from engine.core.outputs import TokenLogprob
from engine.core.sequence import Request


class Sampler:
    """Samples one token per row. One host copy (`tolist`) per step: the tokens are needed anyway."""

    def __init__(self, device: torch.device, seed: int, suppress_token_ids: list[int] | None = None,
                 eos_token_id: int | None = None):
        """`suppress_token_ids` (the checkpoint's `suppress_tokens`) are never sampled, in any mode;
        `eos_token_id` is held back from requests that have not reached their min_tokens."""
        self.device = device
        self.eos_token_id = eos_token_id
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.suppress_ids: torch.Tensor | None = None
        if suppress_token_ids:
            self.suppress_ids = torch.tensor(suppress_token_ids, dtype=torch.long, device=device)  # [S]

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """logits [num_rows, vocab] -> one token id per row, rows in the order of `requests`."""
        return self.choose(self.process(logits, requests), requests)

    def process(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """The logits the choice is made from: suppressed ids, then each request's penalties and bias."""
        if self.suppress_ids is not None:  # -inf: argmax skips them, softmax gives them 0
            logits = logits.index_fill(1, self.suppress_ids, float("-inf"))
        return logits_processors.apply(logits, requests, self.eos_token_id)

    def logprobs(self, logits: torch.Tensor, requests: list[Request], tokens: list[int]) -> list[TokenLogprob | None]:
        """Per row, the chosen token's log-probability and the top alternatives, for requests asking.

        From the processed logits (after penalties and bias, before temperature, top-k and top-p):
        the distribution the model and the request's own changes give, as vLLM's processed logprobs.
        """
        rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        result: list[TokenLogprob | None] = [None] * len(requests)
        if not rows:
            return result
        device = logits.device
        index = torch.tensor(rows, device=device)
        lp = logits.index_select(0, index).float().log_softmax(dim=-1)  # [R, V]
        chosen = lp.gather(1, torch.tensor([tokens[i] for i in rows], device=device)[:, None]).squeeze(1).tolist()
        k = max(requests[i].params.logprobs for i in rows)
        top_values, top_ids = (lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long()))
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for j, i in enumerate(rows):
            n = requests[i].params.logprobs
            result[i] = TokenLogprob(tokens[i], chosen[j], list(zip(top_ids[j][:n], top_values[j][:n], strict=True)))
        return result

    def choose(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """Processed logits [num_rows, vocab] -> one token id per row."""
        if all(r.params.temperature == 0.0 for r in requests):
            return logits.argmax(dim=-1).tolist()
        return self._sample_mixed(logits.float(), requests)

    def _sample_mixed(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        greedy = logits.argmax(dim=-1)  # [N]
        temps = torch.tensor(
            [r.params.temperature or 1.0 for r in requests], dtype=logits.dtype, device=logits.device
        )
        probs_sorted, idx_sorted = self._filtered_sorted_probs(logits / temps[:, None], requests)
        tokens = greedy.clone()
        unseeded = [
            i for i, r in enumerate(requests) if r.params.temperature != 0.0 and r.params.seed is None
        ]
        if unseeded:
            rows = torch.tensor(unseeded, device=logits.device)
            picks = torch.multinomial(probs_sorted[rows], 1, generator=self.generator).squeeze(1)  # [R]
            tokens[rows] = idx_sorted[rows].gather(1, picks[:, None]).squeeze(1)
        for i, request in enumerate(requests):
            if request.params.temperature == 0.0 or request.params.seed is None:
                continue
            pick = torch.multinomial(probs_sorted[i], 1, generator=self._request_generator(request))
            tokens[i] = idx_sorted[i, pick[0]]
        return tokens.tolist()

    @staticmethod
    def _filtered_sorted_probs(
        logits: torch.Tensor, requests: list[Request]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted (descending) probabilities with top-k and top-p applied, and their token ids."""
        sorted_logits, idx_sorted = logits.sort(dim=-1, descending=True)  # [N, V]
        vocab = logits.shape[-1]
        ranks = torch.arange(vocab, device=logits.device)[None, :]  # [1, V]
        top_k = torch.tensor(
            [r.params.top_k or vocab for r in requests], device=logits.device
        )  # [N]
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        top_p = torch.tensor([r.params.top_p for r in requests], dtype=probs.dtype, device=logits.device)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it
        # already does (the first token always stays).
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p[:, None], 0.0)
        return probs, idx_sorted

    def _request_generator(self, request: Request) -> torch.Generator:
        if request.generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(request.params.seed)
            request.generator = generator
        return request.generator
