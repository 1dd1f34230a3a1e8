"""Head training: the schedule, the batch order's seed, the split an epoch is chosen on, the
training moments, an epoch's rows, a head's output fit and scaling, the span loss (each test written
to fail on a mutant that every other test let through)."""

import numpy as np
import pytest
import torch

from bertvision.features.store import FeatureSet
from bertvision.registry.tasks import get_task
from bertvision.training.loop import Lockstep, SeededHead, train_one
from bertvision.training.problems import Problems
from tests.test_pairs_apart import planted_similarity
from tests.test_train_head import RUNTIME, SETTINGS, planted_features

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return planted_features(tmp_path_factory.mktemp("features"), n_shards=2)


def problem(manifest, spec=None, in_memory_max_mb=4096):
    return Problems(get_task("sst2"), manifest, RUNTIME, in_memory_max_mb).get(spec or {"type": "lp"})


def test_a_heads_learning_rate_warms_up_over_its_share_of_all_epochs_steps_then_decays_to_zero(manifest):
    """Mutants that ignored warmup_ratio or never stepped the schedule passed (every other test
    trains with warmup_ratio 0 at a constant rate)."""
    settings = SETTINGS.replace(max_epochs=4, warmup_ratio=0.5, patience=4)  # 25 steps an epoch, 50 of warm-up
    lockstep = Lockstep(get_task("sst2"), [SeededHead("lp", {"type": "lp"}, settings, 1)], problem(manifest), CPU, 1)
    rates = []
    for epoch in range(1, 5):
        lockstep.advance(until=epoch)
        rates.append(lockstep.states[0].opt.param_groups[0]["lr"])
    peak = settings.learning_rate
    assert rates == pytest.approx([peak / 2, peak, peak / 2, 0.0], abs=1e-12)


def test_the_batch_order_follows_the_order_seed(manifest):
    """A mutant that drew every epoch's order from the epoch alone (not ``order_seed``) passed:
    a later seed's lockstep group would train on the first seed's order."""
    task, spec, settings = get_task("sst2"), {"type": "lp"}, SETTINGS.replace(max_epochs=1)
    prob = problem(manifest)

    def trained(order_seed):
        lockstep = Lockstep(task, [SeededHead("lp", spec, settings, 1)], prob, CPU, order_seed)
        lockstep.advance()
        return lockstep.results()[0][0].state_dict()

    first, again, other = trained(1), trained(1), trained(2)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_the_kept_epochs_metrics_are_the_selection_splits_not_devs(manifest):
    """A mutant that chose the epoch on dev passed: the planted splits differ only in their rows."""
    prob = problem(manifest)
    head, best, _, _ = train_one(get_task("sst2"), {"type": "lp"}, SETTINGS.replace(max_epochs=2), prob, 1, CPU)
    metrics, _, _ = prob.evaluate(head)
    assert best["metrics"] == metrics["selection"] != metrics["dev"]


@pytest.mark.parametrize("in_memory_max_mb", [4096, 0], ids=["in-memory", "streamed"])
def test_the_input_moments_are_the_training_splits_with_the_sample_std(manifest, in_memory_max_mb):
    """Mutants that took the moments of the selection split, or the population std, passed."""
    x = FeatureSet.open(manifest, "train").read_all()[0].astype(np.float64)
    mean, std = problem(manifest, in_memory_max_mb=in_memory_max_mb).moments()
    np.testing.assert_allclose(mean.numpy(), x.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std.numpy(), x.std(0, ddof=1), rtol=1e-5)


def test_an_epoch_gives_every_training_row_once_with_its_own_label(manifest):
    """A mutant that dropped an epoch's last, shorter batch passed (400 rows, batches of 16)."""
    x, y, _ = FeatureSet.open(manifest, "train").read_all()
    label_of = {row.tobytes(): label for row, label in zip(x.astype(np.float32), y)}
    batches = list(problem(manifest).epoch(7, 64))
    assert [len(b[1]) for b in batches] == [64] * 6 + [16]
    seen = [(row.numpy().tobytes(), int(label)) for bx, by in batches for row, label in zip(bx, by)]
    assert sorted(r for r, _ in seen) == sorted(label_of)
    assert all(label_of[r] == label for r, label in seen)


class CountingFits:
    """A real problem that counts the head's output fits (``fit_output``)."""

    def __init__(self, problem):
        self.problem, self.fits = problem, 0

    def __getattr__(self, name):
        return getattr(self.problem, name)

    def fit_output(self, head, batch):
        self.fits += 1
        self.problem.fit_output(head, batch)


def test_a_head_that_fits_its_output_fits_it_on_its_first_batch_only(tmp_path):
    """A mutant that refit the cosine head's output on every batch (undoing each step) passed."""
    task, spec = get_task("stsb"), {"type": "cosine"}
    pairs = planted_similarity(tmp_path / "features")
    counting = CountingFits(Problems(task, pairs, RUNTIME, 4096).get(spec))
    train_one(task, spec, SETTINGS.replace(max_epochs=2, patience=4), counting, 1, CPU)
    assert counting.fits == 1


def test_a_standardized_head_reads_its_input_in_training_units_and_answers_in_the_labels():
    """A mutant that added the labels' mean but dropped their std passed (the heads learned the
    scale back): a regression's output is the core head's in standard units of the labels."""
    from bertvision.models.heads import build_head, standardized

    torch.manual_seed(0)
    core = build_head({"type": "mean"}, 3, 4, 1).eval()
    x, mean, std = torch.randn(5, 3, 4), torch.randn(3, 4), torch.rand(3, 4) + 0.5
    head = standardized(core, (mean, std), (2.0, 3.0)).eval()
    with torch.no_grad():
        torch.testing.assert_close(head(x), core((x - mean) / std) * 3.0 + 2.0)


def test_the_span_loss_is_the_mean_of_the_start_and_end_cross_entropies_over_real_tokens():
    """A mutant that scored the end logits against the start positions passed."""
    from bertvision.models.heads import build_head
    from bertvision.training.span import SpanProblem

    torch.manual_seed(0)
    span = SpanProblem.__new__(SpanProblem)  # the loss reads only the device
    span.device = CPU
    head = build_head({"type": "lp"}, 3, 4, 2)
    x, mask = torch.randn(2, 5, 3, 4), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    y = torch.tensor([[1, 3], [0, 2]])
    logits = head(x).masked_fill(~mask[..., None], -1e4)
    ce = torch.nn.functional.cross_entropy
    want = (ce(logits[..., 0], y[:, 0]) + ce(logits[..., 1], y[:, 1])) / 2
    torch.testing.assert_close(span.loss(head, (x, mask, y)), want)
