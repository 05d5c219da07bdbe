"""The head-geometry study (docs/methods.md): its study object, run sets, analyses, paper
outputs, explorer, cost units and stage scripts, over the shared core (``headgeom``)."""
