"""The seed tables behind notebooks 10 and 11: dropout at notebook 10's budget, what multi-query attention costs, the copying model.

Notebook 10 trains one model (seed 0) and says that dropout 0.1 made the same run worse; notebook 11 compares
the shipped multi-head and multi-query models (seed 0) and says that one pair cannot tell whether their
difference is real. These tests train the models with the notebooks' recipe (``lm.make_checkpoint``: about
20 s a run on an idle course machine) and assert the claims, not one machine's trained numbers: a trained loss
moves in its third decimal with the CPU's float path (a paired difference by up to 0.004 between this machine's
two MKL paths, the largest one by 0.002 on a second machine), so every bound below leaves a margin several
times that.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics

import pytest
import torch

from course_utils.experiments import language_model as lm
from course_utils.experiments.data import DATA_DIR

SEEDS = range(8)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> dict[int, tuple[float, float]]:
    return lm.multi_query_pairs(SEEDS, tmp_path_factory.mktemp("checkpoints"))


@pytest.mark.slow
@pytest.mark.evidence("11", "multi-query against multi-head attention, seeds 0 to 7 at notebook 10's training budget "
                            "(the table lab 11 shows, data/gpt_mqa_seeds.json, trained again here): multi-head "
                            "attention's own loss moves from seed to seed by more than the notebook's pair differs; the "
                            "paired differences take both signs, stay within 0.05 nats, and their mean lies within two "
                            "standard errors of zero; seed 0's pair, the notebook's, is below zero")
def test_multi_query_costs_no_measurable_loss_at_notebook_10s_budget(table):
    multi_head = [mha for mha, _ in table.values()]
    differences = [mqa - mha for mha, mqa in table.values()]
    # Measured (multi-query minus multi-head, seeds 0 to 7), MKL_CBWR=AVX2 (pinned) / COMPATIBLE (another path):
    # mean -0.0062 / -0.0052, standard deviation 0.0127 / 0.0130, from -0.0293 / -0.0296 to +0.0095 / +0.0104,
    # three positive on both; multi-head from 2.187 to 2.226 on both; seed 0 -0.0104 / -0.0119.
    # "One pair cannot tell, because training the same model from another seed also moves its loss": multi-head's
    # loss spans more across seeds (0.039) than the notebook's pair differs (0.010). Fails if the seeds agree closely.
    assert max(multi_head) - min(multi_head) > abs(differences[0]), (multi_head, differences[0])
    # Sharing keys and values did not make the loss visibly worse, and its cost is too small to measure: every pair
    # within 0.05 nats, pairs on both sides of zero, the mean within two standard errors of zero (|t| was 1.4 / 1.1).
    # Fails if multi-query costs (or gains) a measurable amount: all pairs one way, or a mean of about 0.009 or more.
    assert max(abs(d) for d in differences) < 0.05, differences
    assert min(differences) < 0 < max(differences), differences
    standard_error = statistics.stdev(differences) / math.sqrt(len(differences))
    assert abs(statistics.mean(differences)) < 2 * standard_error, (statistics.mean(differences), standard_error)
    # the notebook's own pair is seed 0 of this table: multi-query's loss below multi-head's (by 0.010 here)
    assert differences[0] < 0, differences[0]


@pytest.mark.slow
def test_the_shipped_seed_table_is_what_training_gives(table):
    # Lab 11 reads data/gpt_mqa_seeds.json rather than training sixteen models. Each loss moves in its third decimal
    # with the CPU's float path (by up to 0.002 between machines), so 0.005 leaves a margin; a table from another
    # recipe, other seeds or a swapped column is off by more.
    shipped = json.loads((DATA_DIR / "gpt_mqa_seeds.json").read_text(encoding="utf-8"))
    assert shipped["seeds"] == list(table), shipped["seeds"]
    for seed, mha, mqa in zip(shipped["seeds"], shipped["multi-head"], shipped["multi-query"]):
        assert abs(mha - table[seed][0]) < 0.005 and abs(mqa - table[seed][1]) < 0.005, (seed, mha, mqa, table[seed])


@pytest.mark.slow
@pytest.mark.evidence("10", "dropout 0.1 against no dropout at notebook 10's budget, seeds 0 to 2: the validation "
                            "loss with dropout is higher on every seed, by about 0.08 on seed 0")
def test_dropout_raises_the_validation_loss_at_notebook_10s_budget(tmp_path):
    for seed in range(3):
        without = lm.make_checkpoint(tmp_path / "plain.pt", seed=seed)
        with_dropout = lm.make_checkpoint(tmp_path / "dropout.pt", dropout=0.1, seed=seed)
        assert with_dropout > without + 0.03, (seed, without, with_dropout)
        if seed == 0:  # "trained from the same seed with dropout 0.1, the same model ended about 0.08 nats worse"
            assert 0.06 < with_dropout - without < 0.1


@pytest.mark.slow
@pytest.mark.timeout(2400)  # five runs of 3,000 steps; on a busy machine they took more than the default 900 s
@pytest.mark.evidence("11", "the copying model on seeds 0 to 4 (3,000 steps; segments of 2 to 10 tokens placed at random, "
                            "half the tokens set by the rule): it began to copy on four of the five seeds, seed 0 among "
                            "them, at different steps; on each of the four, block 0 has a previous-token head, block 1 a "
                            "head whose weight on the induction position is several times an even share at every distance "
                            "between the copies, and removing either of the two raises the loss on the copyable positions")
def test_the_copying_model_on_five_seeds():
    # Measured (this machine, MKL_CBWR=AVX2), loss on the copyable positions at steps 2000 / 2500 / 3000:
    # seed 0 2.44 / 1.85 / 1.42 (first below 2 nats at step 2500), seed 1 2.54 / 2.26 / 1.59, seed 2 1.96 / 1.46 /
    # 1.29, seed 3 2.65 / 2.63 / 2.57 (no copying; block 0's heads 0.66 and 0.74 on the previous position, block 1 at
    # most 0.21 on the induction position), seed 4 2.59 / 2.39 / 1.65. On seeds 0, 1, 2, 4: block 0's strongest
    # previous-token head 0.98 / 0.99 / 0.88 / 0.95 on key i - 1; block 1's strongest induction head 0.43-0.59 /
    # 0.22-0.60 / 0.42-0.68 / 0.36-0.58 on the induction position across distances 2 to 14 (an even share is about
    # 0.09 at d = 2, less beyond); removing that previous-token head +1.94 / +1.66 / +1.32 / +1.32 nats, that
    # induction head +0.77 / +0.57 / +1.36 / +0.69. On seeds 0 and 1 both heads of block 1 attend to the induction
    # position (removing the weaker: +0.46 / +0.51), so the claim is not that the other heads matter less.
    copied = []
    for seed in range(5):
        config = lm.InductionConfig(seed=seed)
        model, measured, losses = lm.train_on_repeats(config)
        final = losses["copyable positions"][-1]
        if final > 2.2:  # it has not begun to copy, and is not borderline
            assert final > 2.4, (seed, final)
            continue
        copied.append(seed)
        tokens, marks, lag = lm.copy_task(512, config, torch.Generator().manual_seed(20_000))
        maps = lm.attention_weights(model, tokens[:, :-1])  # (B, 2, H, T, T)
        previous = maps[:, 0].diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))  # (H,): block 0, key i - 1
        previous_head = int(previous.argmax())
        assert previous[previous_head] > 0.6, (seed, previous)
        rows, queries = marks.nonzero(as_tuple=True)
        on_induction = maps[rows, 1, :, queries, queries - lag[rows] + 1]  # (N, H): block 1, the induction position
        distances = sorted(set(lag[rows].tolist()))
        per_distance = torch.stack([on_induction[lag[rows] == d].mean(dim=0) for d in distances])  # (distances, H)
        even = torch.tensor([(1 / (queries[lag[rows] == d] + 1)).mean().item() for d in distances])
        induction_head = int(per_distance.mean(dim=0).argmax())
        assert distances[0] == 2 and (per_distance[:, induction_head] > 2 * even).all(), (seed, per_distance, even)
        assert (per_distance[1:, induction_head] > 3 * even[1:]).all(), (seed, per_distance, even)
        everything = lm.copy_loss(model, tokens, marks)
        assert lm.loss_without_head(model, 0, previous_head, tokens, marks) > everything + 0.3, seed
        assert lm.loss_without_head(model, 1, induction_head, tokens, marks) > everything + 0.3, seed
    # Fails if every seed copies within the budget, or fewer than three do.
    assert 0 in copied and 3 <= len(copied) <= 4, copied


def test_the_seed_table_matches_its_row_in_data_readme():
    raw = (DATA_DIR / "gpt_mqa_seeds.json").read_bytes()
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    row = [line.split(" | ") for line in readme.splitlines() if line.startswith("| `gpt_mqa_seeds.json` |")]
    assert row, "data/README.md has no row for gpt_mqa_seeds.json"
    assert (len(raw), hashlib.sha256(raw).hexdigest()) == (int(row[0][1].replace(",", "")), row[0][2].strip("`"))
    table = json.loads(raw)
    assert table["seeds"] == list(SEEDS) and len(table["multi-head"]) == len(table["multi-query"]) == len(SEEDS)
