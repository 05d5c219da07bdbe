"""The SA-MoE study's stage scripts: one module per rule of workflow/samoe/, each with
``main(argv)``, run as ``python -m headgeom.samoe.stages.<name>``."""
