"""Per-request changes to the logits before sampling: penalties, logit_bias, min_tokens.

Only rows whose request asks for one are touched, gathered into one sub-batch so that each kind
is a handful of tensor ops however many requests use it (vLLM applies them the same way):

    repetition_penalty   tokens seen in prompt or output: logit / p if positive, logit * p if not
    frequency_penalty    logit -= f * (times the token was generated)
    presence_penalty     logit -= p * (1 if the token was generated at all)
    logit_bias           logit += bias[token]
    min_tokens           eos and stop_token_ids get -inf until min_tokens were generated

Repetition penalty first (it scales the model's logits, as in Hugging Face and vLLM), then the
additive OpenAI penalties, then the bias, then the min_tokens mask.
"""

import torch

from engine.core.sequence import Request


def apply(logits: torch.Tensor, requests: list[Request], eos_token_id: int | None) -> torch.Tensor:
    """logits [N, V] -> logits with every asked-for change applied (a new tensor when any row changes)."""
    rows = [i for i, r in enumerate(requests) if r.params.processes_logits]
    if not rows:
        return logits
    chosen = [requests[i] for i in rows]
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index).float()  # [R, V]
    vocab = sub.shape[1]
    _repetition(sub, chosen, vocab)
    _frequency_presence(sub, chosen, vocab)
    _bias(sub, chosen)
    _min_tokens(sub, chosen, eos_token_id)
    out = logits.float() if logits.dtype != torch.float32 else logits.clone()
    return out.index_copy_(0, index, sub)


def _occurrences(sub: torch.Tensor, token_lists: list[list[int]], vocab: int) -> torch.Tensor:
    """[R, V] counts of each token id in each row's list (padding goes to a spare column, then dropped)."""
    width = max((len(ids) for ids in token_lists), default=0)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=sub.dtype, device=sub.device)
    if width:
        ids = torch.tensor([ids + [vocab] * (width - len(ids)) for ids in token_lists], device=sub.device)
        counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=sub.dtype, device=sub.device))
    return counts[:, :vocab]


def _repetition(sub: torch.Tensor, requests: list[Request], vocab: int) -> None:
    local = [j for j, r in enumerate(requests) if r.params.repetition_penalty != 1.0]
    if not local:
        return
    seen = _occurrences(sub, [requests[j].all_token_ids for j in local], vocab) > 0  # [L, V]
    index = torch.tensor(local, device=sub.device)
    penalty = torch.tensor([requests[j].params.repetition_penalty for j in local], dtype=sub.dtype,
                           device=sub.device)[:, None]  # [L, 1]
    part = sub.index_select(0, index)
    scaled = torch.where(part > 0, part / penalty, part * penalty)
    sub.index_copy_(0, index, torch.where(seen, scaled, part))


def _frequency_presence(sub: torch.Tensor, requests: list[Request], vocab: int) -> None:
    local = [j for j, r in enumerate(requests) if r.params.frequency_penalty or r.params.presence_penalty]
    if not local:
        return
    counts = _occurrences(sub, [requests[j].output_token_ids for j in local], vocab)  # [L, V]
    index = torch.tensor(local, device=sub.device)
    frequency = torch.tensor([requests[j].params.frequency_penalty for j in local], dtype=sub.dtype,
                             device=sub.device)[:, None]
    presence = torch.tensor([requests[j].params.presence_penalty for j in local], dtype=sub.dtype,
                            device=sub.device)[:, None]
    sub.index_add_(0, index, -(frequency * counts + presence * (counts > 0).to(sub.dtype)))


def _bias(sub: torch.Tensor, requests: list[Request]) -> None:
    rows, cols, values = [], [], []
    for j, request in enumerate(requests):
        for token_id, bias in request.params.logit_bias.items():
            rows.append(j)
            cols.append(token_id)
            values.append(bias)
    if rows:
        device = sub.device
        sub.index_put_((torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
                       torch.tensor(values, dtype=sub.dtype, device=device), accumulate=True)


def _min_tokens(sub: torch.Tensor, requests: list[Request], eos_token_id: int | None) -> None:
    rows, cols = [], []
    for j, request in enumerate(requests):
        params = request.params
        if request.num_output_tokens >= params.min_tokens:
            continue
        stops = list(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stops.append(eos_token_id)
        rows.extend([j] * len(stops))
        cols.extend(stops)
    if rows:
        device = sub.device
        sub[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = float("-inf")
