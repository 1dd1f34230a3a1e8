"""What each rule's job asks the scheduler for (``mem_mb``, ``runtime``, and for head jobs
``gpu``), from the workflow's settings and the job's wildcards: the rules name a method and a
resource (``rules/common.smk`` ``request``); the estimates themselves are
``plan.estimates``'s."""

from __future__ import annotations

from bertvision.config.workflow import WorkflowSettings
from bertvision.layout import Checkpoint
from bertvision.plan import estimates as estimate
from bertvision.registry.tasks import get_task


class RuleRequests:
    """One method per kind of job, each ``(wildcards, attempt, ...) -> {resource: value}``;
    ``wildcards`` is the job's (``task``, ``model`` and what the rule's pattern names), ``gpus``
    what the GPU rules ask for (``WorkflowSettings.gpu_rules``)."""

    def __init__(self, settings: WorkflowSettings, gpus: int):
        self.s, self.gpus = settings, gpus

    def shape(self, model: str) -> estimate.EncoderShape:
        return estimate.EncoderShape.of(self.s.pretrained(model))

    def data(self, wildcards, attempt: int, tokens: bool) -> dict:
        """Downloading (``tokens`` False) or tokenizing a task."""
        task = wildcards.task
        return estimate.data_request(self.s.train_rows(task), self.s.max_length(task) if tokens else 0, attempt)

    def _training(self, wildcards, attempt: int, batch_size: int, epochs: float) -> dict:
        task = wildcards.task
        return estimate.finetune_request(
            self.shape(wildcards.model), batch_size, self.s.max_length(task), self.s.train_rows(task), epochs,
            self.gpus, attempt,
        )  # fmt: skip

    def serving(self, wildcards, attempt: int) -> dict:
        return estimate.loading_request(self.shape(wildcards.model), attempt)

    def finetune(self, wildcards, attempt: int) -> dict:
        """One fine-tuning job trains from the checkpoint before its own; checkpoint 0 trains nothing."""
        here = Checkpoint.named(wildcards.checkpoint)
        if here.fraction == 0:
            return estimate.loading_request(self.shape(wildcards.model), attempt)
        before = self.s.checkpoint_before(here)
        epochs = max(here.fraction - (before.fraction if before else 0), 0.01)
        return self._training(wildcards, attempt, self.s.finetune(wildcards.model, wildcards.task).optimizer.batch_size,
                              epochs)  # fmt: skip

    def baseline(self, wildcards, attempt: int) -> dict:
        base = self.s.baseline(wildcards.model, wildcards.task)
        return self._training(wildcards, attempt, base.optimizer.batch_size, base.epochs)

    def bert_curve(self, wildcards, attempt: int) -> dict:
        curve = self.s.bert_curve(wildcards.model, wildcards.task)
        return self._training(wildcards, attempt, curve.optimizer.batch_size, max(curve.points))

    def peer(self, wildcards, attempt: int) -> dict:
        """An encoder-training peer (LoRA, BitFit, SetFit) as full fine-tuning, one run per
        learning rate; the embedding peers read the task's embeddings (rule embed): a linear model."""
        settings = self.s.peer(wildcards.model, wildcards.task, wildcards.peer)
        if not hasattr(settings.method, "learning_rates"):
            texts = len(get_task(wildcards.task).text_fields)
            return estimate.linear_peer_request(self.s.train_rows(wildcards.task), self.shape(wildcards.model).hidden,
                                                texts, attempt)  # fmt: skip
        epochs = len(settings.method.learning_rates) * getattr(settings.method, "epochs", 1)
        return self._training(wildcards, attempt, settings.optimizer.batch_size if settings.optimizer else 16, epochs)

    def embed(self, wildcards, attempt: int) -> dict:
        """One pass over the task's texts, no gradients."""
        task = wildcards.task
        batch = self.s.embedding(wildcards.model, task).method.batch_size
        return estimate.encoding_request(
            self.shape(wildcards.model), batch, self.s.max_length(task), self.s.train_rows(task), min(self.gpus, 1),
            attempt,
        )  # fmt: skip

    def mixture(self, wildcards, attempt: int) -> dict:
        """A shared encoder fine-tuned on a mixture of tasks: every task's rows, the longest length."""
        mix = self.s.mixture(wildcards.model, wildcards.encoder)
        return estimate.finetune_request(
            self.shape(wildcards.model), mix.optimizer.batch_size, max(self.s.max_length(t) for t in mix.tasks),
            sum(self.s.train_rows(t) for t in mix.tasks), mix.epochs, self.gpus, attempt,
        )  # fmt: skip

    def extract(self, wildcards, attempt: int) -> dict:
        ex, task = self.s.extract(), wildcards.task
        return estimate.extract_request(
            self.shape(wildcards.model), ex.batch_size, ex.block_rows, ex.block_tokens, self.s.max_length(task),
            self.s.train_rows(task), self.s.shards, self.s.feature_level(task) == "tokens", self.gpus, attempt,
            "apart" in self.s.pair_forms(task),
        )  # fmt: skip

    def bert_scoring(self, wildcards, attempt: int, scored_in_extraction: bool) -> dict:
        """Scoring the outputs the extraction kept is light; running the checkpoint asks what an
        extraction does."""
        if scored_in_extraction:
            return {"mem_mb": 2000, "runtime": 10 * attempt}
        return self.extract(wildcards, attempt)

    def heads(self, wildcards, attempt: int, runs: dict | None, training: bool = True) -> dict:
        """``runs``: head name -> trainings the job does (its seeds, or trials), sized by each
        head's own final settings; None: a job that trains no head. ``training`` False: a job that
        only evaluates trained heads. A data-fraction job trains on its ``train_fraction``. GPUs:
        the extraction's when the job streams the encoder, or when on a CPU it would ask for more
        than ``HEAD_GPU_MINUTES`` (token-level heads, span windows, the CNN heads at paper scale)."""
        gpus = self.gpus
        if gpus and self.s.store(wildcards.task):
            on_cpu = self._heads(wildcards, 1, runs, 0, training)["runtime"]
            gpus = gpus if on_cpu > estimate.HEAD_GPU_MINUTES else 0
        return {**self._heads(wildcards, attempt, runs, gpus, training), "gpu": gpus}

    def _heads(self, wildcards, attempt: int, runs: dict | None, gpus: int, training: bool) -> dict:
        task = wildcards.task
        return estimate.heads_request(
            self.shape(wildcards.model), self.s.train_rows(task), self.s.max_length(task),
            self.s.feature_level(task) == "tokens", attempt=attempt, streamed=not self.s.store(task), gpus=gpus,
            training=training, train_fraction=float(getattr(wildcards, "train_fraction", 1)),
            **self.s.head_job_terms(task, runs),
        )  # fmt: skip
