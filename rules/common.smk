"""Helpers shared by the rules: the validated config, paths from bertvision.layout, settings
as JSON params, target lists and what each job asks the scheduler for."""

import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

try:
    import bertvision
except ModuleNotFoundError:
    raise WorkflowError(
        f"the bertvision package is not installed for {sys.executable}: run `make setup` (or "
        "`pip install -e .` in the repository) and use that environment's snakemake"
    ) from None
from bertvision import layout as L
from bertvision.config.schema import read_config, validate_config
from bertvision.config.workflow import WorkflowSettings
from bertvision.errors import BertvisionError
from bertvision.models.backbone import backbone_files
from bertvision.registry.peers import get_peer
from bertvision.registry.task_spec import scored_splits, splits_of
from bertvision.registry.tasks import DECLARED_ENV, declared_json, get_task
from bertvision.plan.race import RaceReach
from bertvision.plan.requests import RuleRequests
from bertvision.plan.files import RunFiles, below_here
from bertvision.plan.targets import Targets

# Errors name where the config came from (its files, then --config's values over them) and the key at fault.
GIVEN = [*map(str, workflow.configfiles), *(["--config"] if workflow.config_settings.config else [])]
CONFIG_SOURCE = " + ".join(GIVEN) or "workflow config"
try:
    for given in workflow.configfiles:  # Snakemake's own reading keeps the last of a key given twice
        read_config(Path(given))
    S = WorkflowSettings(validate_config(config, source=CONFIG_SOURCE), source=CONFIG_SOURCE)
except BertvisionError as err:
    raise WorkflowError(str(err)) from None

# The config's own tasks (tasks.<name>.files) travel to every job in its environment, so that each
# job's process knows them by name as it knows the registry's (bertvision.registry.tasks.get_task).
if S.declared:
    os.environ[DECLARED_ENV] = declared_json(S.declared)

# Rules call the `bertvision` command of the environment running Snakemake, even when that
# environment is not activated (e.g. `.venv/bin/snakemake`).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


wildcard_constraints:
    model=r"[A-Za-z0-9_.-]+",
    task=r"[a-z0-9][a-z0-9-]*",
    checkpoint=r"[0-9.]+",
    ftseed=r"\d+",
    shard=r"\d+",
    head=r"[A-Za-z0-9_.-]+",
    worker=r"\d+",
    train_fraction=r"[0-9.]+",
    seed=r"\d+",
    peer=r"[a-z]+",
    encoder=r"[A-Za-z0-9_.-]+",


def as_json(obj):
    """``obj`` (typed settings, or plain data that may hold some) as a `bertvision` command reads it."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    return json.dumps(obj, sort_keys=True, default=lambda settings: settings.model_dump(mode="json"))


# --- the files runs' jobs leave, as the rules that read them list them, and the workflow's targets
FILES = RunFiles(S)
TARGETS = Targets(S)


def get_source_arg(run):
    """A head job's `--manifest` argument, shell-quoted: the manifest, or the stream source (JSON)."""
    from bertvision.features.source import StreamSource

    if run.stored:
        return shlex.quote(run.format(L.MANIFEST))
    weights, tokens = FILES.features(run)
    source = StreamSource(os.path.dirname(weights), tokens, S.extract(), S.extract_compute(), S.extract_attrs(run))
    return shlex.quote(source.to_json())


def get_features_arg(wildcards):
    return get_source_arg(FILES.run(wildcards))


def get_source_files(wildcards):
    """The local files a download reads, so that replacing one reruns the download."""
    try:
        return below_here(S.download(wildcards.task).source_files(get_task(wildcards.task)))
    except BertvisionError as err:
        raise WorkflowError(str(err)) from None


def get_backbone_files(wildcards):
    """A local backbone folder's files, so that weights replaced in place rerun the backbone's jobs."""
    return below_here(backbone_files(S.pretrained(wildcards.model)))


# --- the runs the pick chose among: every configured checkpoint (grid), or those the race reached
# (each decision a Snakemake checkpoint job, rules/race.smk, read once it has run)
RACE = RaceReach(
    S, lambda model, task, checkpoint: checkpoints.race_checkpoint.get(model=model, task=task, checkpoint=checkpoint).output[0]
)


def get_per_task(files, by_model=False):
    """Named inputs, one per backbone and task, each its own function (``files(model, task,
    runs)``: the paths it needs of the runs the race reached): an input function that meets an
    undecided checkpoint holds back its own task only, so every task's race goes on at once.
    ``by_model``: a rule with a {model} wildcard asks for that backbone's tasks only."""
    return {
        f"{m}__{t}": lambda wc, m=m, t=t: [] if by_model and wc.model != m else files(m, t, RACE.runs_of(m, t))
        for m in S.models
        for t in S.tasks
    }


def get_bundle_task_settings(model, tasks, heads=None):
    """What a bundle records of each task's tokenization and, given ``heads`` (task -> names), the
    heads it serves (``serving.settings.BundleTaskSettings``)."""
    return as_json(
        {
            t: {"max_length": S.max_length(t), "doc_stride": S.tokenize(model, t).doc_stride}
            | ({"heads": heads[t]} if heads else {})
            for t in tasks
        }
    )


def get_study_storage(wildcards):
    """The configured RDB URL, or a journal file beside the study's worker records."""
    return S.search_storage or L.STUDY_JOURNAL.format(**wildcards)


def get_search_head(wildcards):
    """The head a study's trials start from: its settings less what the search draws (``unsearched``)."""
    from bertvision.training.search_space import unsearched

    return as_json(unsearched(S.head_settings(wildcards.task, [wildcards.head])[wildcards.head], S.search().space))


def get_searched_args(wildcards, heads=None):
    """`--searched` arguments: HEAD=search/.../HEAD/best.json."""
    return " ".join(f"{head}={path}" for head, path in FILES.searched_best(wildcards, heads).items())


# Cluster settings from the environment (docs/operations.md, "On a cluster"). The GPU rules ask for
# --gpus=<model>:<n> when BERTVISION_SLURM_GPU_MODEL is set, --gpus=<n> otherwise; rules that
# ask for no GPU never get a model (the slurm plugin would turn a model alone into one GPU).
GPU = S.gpu_rules
GPU_MODEL = (os.environ.get("BERTVISION_SLURM_GPU_MODEL") or None) if GPU > 0 else None


def get_micro_batches(wildcards, attempt):
    """Attempt n (after running out of GPU memory) splits each batch into 2^(n-1) micro-batches."""
    return 2 ** (attempt - 1)


def get_launcher(wildcards, resources):
    """`bertvision`, or `torchrun` with one data-parallel rank per GPU when the job has more
    than one (fine-tuning only)."""
    gpus = int(resources.gpu)
    return f"torchrun --standalone --nproc-per-node {gpus} -m bertvision" if gpus > 1 else "bertvision"


# --- what each job asks the scheduler for, computed from the config (bertvision/plan/requests.py)
REQUESTS = RuleRequests(S, GPU)


def get_requests(estimate, *estimated, gpus=None, micro_batches=False, **options):
    """A rule's resources: mem_mb and runtime from ``estimate`` (a ``REQUESTS`` method), and the
    ``estimated`` ones it gives too (a head job's gpu); ``options`` that are functions are read
    from the job's wildcards. ``gpus`` (a count, or a function of the wildcards): a GPU rule's.
    A job with a GPU names GPU_MODEL, one without none (the slurm plugin would send --gpus=MODEL:0).
    ``micro_batches``: the job splits each batch after running out of GPU memory (``get_micro_batches``)."""
    def of_job(resource):
        def request(wildcards, attempt):
            given = {k: v(wildcards) if callable(v) else v for k, v in options.items()}
            return estimate(wildcards, attempt, **given)[resource]

        return request

    requests = {resource: of_job(resource) for resource in (*estimated, "mem_mb", "runtime")}
    if gpus is not None:
        requests["gpu"] = (lambda wildcards, attempt: gpus(wildcards)) if callable(gpus) else gpus
    if "gpu" in requests:
        count = requests["gpu"]
        has_gpu = lambda wildcards, attempt: (count(wildcards, attempt) if callable(count) else count) > 0
        requests["gpu_model"] = lambda wildcards, attempt: GPU_MODEL if has_gpu(wildcards, attempt) else None
    return requests | ({"micro_batches": get_micro_batches} if micro_batches else {})


def get_previous_checkpoint(wildcards):
    """The files a fine-tuning job goes on from: the run's checkpoint before this one (none for the first)."""
    before = S.checkpoint_before(L.Checkpoint.named(wildcards.checkpoint))
    if before is None:
        return []
    return expand(L.CHECKPOINT_FILE, **{**wildcards, "checkpoint": before}, file=["model.safetensors", L.RESUME_STATE])


def get_previous_flag(wildcards, input):
    """``--previous DIR``: the directory of the checkpoint the job goes on from; nothing for the first."""
    return f"--previous {shlex.quote(os.path.dirname(input.previous[0]))}" if input.previous else ""


def get_extract_settings(wildcards, resources):
    """The extraction's batch and blocks, which bound its memory as its micro-batches do: resources,
    so that a change reruns no extraction (a param made from resources is no rerun trigger)."""
    return as_json(S.extract().replace(**{k: resources[f"extract_{k}"] for k in S.extract().keys()}))


def get_optimizer_state(wildcards):
    """A fine-tuning job keeps AdamW's state for the checkpoint after it; the last drops it."""
    return "drop" if L.Checkpoint.named(wildcards.checkpoint) == S.checkpoints[-1] else "keep"


def get_peer_embeddings(wildcards):
    """The task's shared sentence embeddings, for a peer that reads them (none for the others)."""
    return L.EMBEDDINGS.format(**wildcards) if get_peer(wildcards.peer).reads_embeddings else []


def get_head_runs(wildcards):
    """Head name -> trainings a job does."""
    return dict.fromkeys(S.task_heads(wildcards.task), len(S.head_seeds))


def get_subset_runs(wildcards):
    return dict.fromkeys(S.data_fraction_heads(wildcards.task), len(S.head_seeds))


def get_trials_per_worker(wildcards):
    return {wildcards.head: -(-S.search().trials // S.search_workers)}


def get_table_outputs(names, category):
    """Named outputs ``{name}_md`` and ``{name}_csv`` of a table rule; the CSVs go into the
    HTML report with their caption (workflow/report/{name}_table.rst)."""
    outputs = {}
    for name in names:
        outputs[f"{name}_md"] = L.table(name, "md")
        outputs[f"{name}_csv"] = report(L.table(name, "csv"), category=category,
                                        caption=f"../workflow/report/{name}_table.rst")
    return outputs


# --- shared encoders (rules/shared.smk)


def get_shared_encoder(wildcards):
    return S.shared_encoders()[wildcards.encoder]


def get_encoder_weights(wildcards):
    """The shared encoder's model.safetensors (for a bundle: that of the first fine-tuning seed)."""
    ftseed = int(wildcards.get("ftseed", S.shared_ft_seeds[0]))
    return f"{get_shared_encoder(wildcards).checkpoint_dir(wildcards.model, ftseed, S.shared_tasks[0])}/model.safetensors"


def get_mixture_tokens(wildcards):
    """Task -> tokens directory of every task a mixture trains on."""
    return {t: L.TOKENS_DIR.format(model=wildcards.model, task=t) for t in S.mixture(wildcards.model, wildcards.encoder).tasks}


def get_mixture_epochs():
    return {n: S.mixture(S.models[0], n).epochs for n, enc in S.shared_encoders().items() if enc.kind == "mixture"}


def get_shared_head_runs(wildcards):
    return dict.fromkeys(S.shared_heads(wildcards.task), len(S.head_seeds))


def get_finished_heads(wildcards):
    """`--finish`: the heads an experiment reads from this head job (``S.finished_heads``)."""
    names = S.finished_heads(FILES.run(wildcards))
    return f"--finish {' '.join(names)}" if names else ""


def get_bundle_heads(wildcards):
    """Task -> the heads directory of each shared task on the bundle's encoder (first fine-tuning seed)."""
    enc = get_shared_encoder(wildcards)
    return {t: enc.heads_dir(wildcards.model, S.shared_ft_seeds[0], t) for t in S.shared_tasks}


# --- serving the summary's picks (rules/serve.smk)


def get_backbone_runs(wildcards):
    return RACE.runs(models=[wildcards.model])
