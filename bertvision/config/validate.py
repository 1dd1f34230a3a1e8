"""``bertvision validate-config``: a config file checked as a run would check it, before anything
runs: the schema, the cross-key checks, and every row of the files of the tasks it declares."""

from __future__ import annotations

from pathlib import Path

from bertvision.config.declared_tasks import check_files
from bertvision.config.workflow import WorkflowSettings
from bertvision.errors import ConfigError
from bertvision.models.backbone import uncached_hub_id


def validate_config_file(configs: list[Path], show: bool = False) -> None:
    """``bertvision validate-config``: check ``configs``, each over the ones before as ``snakemake
    --configfile A B`` merges them (a config and its overlays), and every row of the files of the
    tasks they declare (print the config with every default filled in, ``show``)."""
    import yaml

    settings = WorkflowSettings.from_files(configs)
    source = settings.source
    notes = []
    for task in settings.declared:
        try:
            notes += check_files(task)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
    if show:
        print(yaml.safe_dump(settings.config, sort_keys=False), end="")
    else:
        print(f"{source}: valid")
        for model in settings.models:
            if uncached_hub_id(ref := settings.pretrained(model)):
                print(f"{source}: note: backbones.{model}.pretrained: {ref} is not in this machine's Hugging Face "
                      "cache; the run downloads it (without network: download it first). Until its config.json is "
                      "here, its width and length limit are unknown: heads.models' shapes and the tasks' max_length "
                      "are not checked against it (hf download ID config.json checks them)")  # fmt: skip
        for note in notes:
            print(f"{source}: note: {note}")
