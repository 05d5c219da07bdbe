"""The head-geometry study's stage scripts: one module per rule of workflow/heads/, each with
``main(argv)``, run as ``python -m headgeom.heads.stages.<name>``."""
