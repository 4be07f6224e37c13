"""The seed table behind notebook 09's sentences on what multi-query attention costs in loss.

Section 6 trains one multi-query model beside the multi-head one and asserts its
own numbers. Whether their difference is real needs more seeds than the notebook's
time budget allows, so the prose reports a sweep over seeds 0 to 7 made "outside
this notebook, with the same code". This test is that sweep: it trains both models
(G = 4 and G = 1) from each seed with the notebook's recipe (about 20 s a run on
the course machine, 16 runs) and asserts every number the prose gives.
"""

from __future__ import annotations

import pytest
import torch

from course_utils.blocks.gpt import GPT, GPTConfig
from course_utils.experiments import language_model as lm

SEEDS = range(8)


def _validation_loss(num_groups: int, seed: int, train_ids: torch.Tensor, val_windows: torch.Tensor, V: int) -> float:
    torch.manual_seed(seed)  # the notebook: torch.manual_seed(0), then the model; train_config's seed draws the batches
    model = GPT(GPTConfig(vocab_size=V, max_len=64, d_model=96, num_heads=4, num_groups=num_groups, num_layers=3,
                          d_ff=384, dropout=0.0))
    config = lm.LMTrainConfig(steps=500, batch_size=16, length=64, peak_lr=6e-3, warmup_steps=30, min_lr=6e-4,
                              weight_decay=0.1, grad_clip=1.0, seed=seed)
    lm.train_language_model(model, train_ids, config, label=f"seed table, G = {num_groups}, seed {seed}")
    return lm.evaluate(model, val_windows)


@pytest.fixture(scope="module")
def table() -> dict[int, tuple[float, float]]:
    text = lm.load_devils_dictionary()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text])
    n_train = int(0.9 * len(data))
    train_ids, val_ids = data[:n_train], data[n_train:]
    val_windows = lm.evaluation_windows(val_ids, 64)
    return {seed: (_validation_loss(4, seed, train_ids, val_windows, len(chars)),
                   _validation_loss(1, seed, train_ids, val_windows, len(chars))) for seed in SEEDS}


@pytest.mark.evidence("09", "multi-query against multi-head attention, seeds 0 to 7 at the notebook's training budget: "
                          "the difference in loss, against the seed-to-seed spread")
def test_multi_query_costs_no_measurable_loss_at_notebook_09s_budget(table):
    multi_head = [mha for mha, _ in table.values()]
    differences = [mqa - mha for mha, mqa in table.values()]
    # "multi-head attention's validation loss ranged from 2.187 to 2.226 nats per character, a spread of 0.04"
    assert 2.185 < min(multi_head) < 2.19 and 2.22 < max(multi_head) < 2.23, multi_head
    # "multi-query minus multi-head ranged from -0.029 to +0.010"
    assert -0.03 < min(differences) < -0.028 and 0.009 < max(differences) <= 0.01, differences
    # "mostly in multi-query attention's favour, never against it by more than 0.01"
    assert sum(d < 0 for d in differences) > len(differences) / 2
    # "The bound of 0.03 that the cell asserts held on every one of these seeds."
    assert all(d < 0.03 for d in differences)
    # the notebook's own run is seed 0 of this table: -0.010
    assert abs(differences[0] + 0.010) < 0.001
