"""Membership scores, exposure (Carlini et al. 2019, arXiv 1802.08232) and the MIA AUC; no torch at import."""

from __future__ import annotations

import math


def sequence_losses(model, examples: list, *, pad_id: int, device, batch_size: int) -> list[float]:
    """Mean per-token NLL (nats) of each (input_ids, labels) example, masked as in training; shape (n,).

    Raises:
        ValueError: an example has no target token.
    """
    import torch

    from dplora.engine.batch import collate
    from dplora.evaluate.heldout import token_nll

    losses: list[float] = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = collate(examples[start : start + batch_size], pad_id, device=device)
            nll, tokens = token_nll(model, batch)
            if bool((tokens == 0).any()):
                raise ValueError("a canary has no target token (max_seq_len too short for the canary reply?)")
            losses.extend((nll.double() / tokens).tolist())
    return losses


def exposure(canary_loss: float, candidate_losses: list[float]) -> float:
    """Exposure in bits: log2(n + 1) − log2(rank), rank of the canary among itself and n random candidates.

    Source: Carlini et al. (2019), "The Secret Sharer", Def. 2 (estimated by sampling candidates, Sec. 4.2).
    Ties count against the canary (rank = 1 + candidates with loss ≤ the canary's). Random ranks average
    about 1/ln 2 ≈ 1.44 bits; the maximum is log2(n + 1).
    """
    rank = 1 + sum(1 for c in candidate_losses if c <= canary_loss)
    return math.log2(len(candidate_losses) + 1) - math.log2(rank)


def auc(member_scores: list[float], non_member_scores: list[float]) -> float:
    """ROC AUC of members against non-members (higher score = member), ties counted 1/2 (Mann–Whitney U / n₁n₀).

    Raises:
        ValueError: either group is empty.
    """
    if not member_scores or not non_member_scores:
        raise ValueError("AUC needs at least one member and one non-member canary")
    wins = 0.0
    for a in member_scores:
        for b in non_member_scores:
            wins += 1.0 if a > b else 0.5 if a == b else 0.0
    return wins / (len(member_scores) * len(non_member_scores))
