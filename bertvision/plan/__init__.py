"""The workflow's plan as the Snakemake rules read it (``rules/common.smk`` declares one of each):
the files runs' jobs leave (``files``), the targets (``targets``), the runs the race reached
(``race``) and what each job asks the scheduler for (``requests``)."""
