"""Every paper table and figure, one record each (:class:`headgeom.paper.output.Output`),
in the paper's order of sections. The workflow, the document and the report read them
here; nothing adds to them after this module is loaded.

Each record names its inputs by kind: ``kind -> (result, run set)``, the result a path
template of the workflow (workflow/rules/common.smk, PATHS) and the run set the runs it is
read for (``headgeom.study.Study.paper_inputs``; None: one cross-run file).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from headgeom.paper.output import (
    ALIGNMENT,
    APPENDIX_B,
    CONCENTRATION,
    EXCLUSIVITY,
    LANES,
    SECTIONS,
    SETUP,
    SUMMARY,
    Output,
)

#: The block ablation atlas is a table and a figure of the same Parquets.
_ATLAS = {"runs": ("train_log", "ablation_atlas"), "atlas": ("ablation_atlas", "ablation_atlas")}

RECORDS: tuple[Output, ...] = (
    # ---- the study in one page (summary.py)
    Output("table1", "table", SUMMARY, build="summary:table1", document=True, summary=True,
           inputs={
               "runs": ("train_log", "runs"),
               "summaries": ("summary", "runs"),
               "eval": ("eval", "runs"),  # the capacity covariation's clean margins (§12.1)
               "robustness": ("robustness", "runs"),
               "lanes": ("lanes", "runs"),
               "exclusivity": ("exclusivity", "exclusivity"),
               "clamp_pairs": ("clamp_pairs", "clamp_pairs"),
               "clamp_lumped": ("clamp_lumped", "clamp_lumped"),
               "coordinates": ("coordinates", "coordinates"),
           }),
    # every kind one of the comparison's recipes asks for (headgeom.paper.recipes)
    Output("comparison", "table", SUMMARY, build="summary:comparison", document=True,
           summary=True,
           inputs={
               "runs": ("train_log", "runs"),
               "summaries": ("summary", "runs"),
               "robustness": ("robustness", "runs"),
               "conditions": ("conditions", "pairs"),
               "logo": ("logo", "runs"),
               "eval": ("eval", "runs"),
               "lanes": ("lanes", "runs"),
               "heads": ("heads", "runs"),
               "geometry": ("geometry_summary", "runs"),
               "paired": ("paired", "paired_tasks"),
               "spearman": ("spearman", None),
               "loss": ("loss", None),
               "exclusivity": ("exclusivity", "exclusivity"),
               "clamp_pairs": ("clamp_pairs", "clamp_pairs"),
               "clamp_paths": ("clamp_paths", "clamps"),
               "clamp_lumped": ("clamp_lumped", "clamp_lumped"),
               "timeline": ("timeline", "dynamics_timeline"),
               "tau": ("tau", "dynamics_timeline"),
               "value_gradients": ("value_gradients", "dynamics_timeline"),
               "scalar_ablation": ("scalar_ablation", "dynamics_ablation"),
               "edge_summary": ("edge_summary", "edges"),
               "acdc": ("acdc", "acdc"),
               "coordinates": ("coordinates", "coordinates"),
           }),
    Output("checks", "table", SUMMARY, build="summary:checks", document=True, summary=True,
           inputs={"checks": ("checks", None)}),  # every logged acceptance check (docs §18)
    # ---- §4 Setup (setup.py)
    Output("table2", "table", SETUP, build="setup:table2_paper",
           inputs={"runs": ("train_log", "selection"), "all_runs": ("train_log", "runs")}),
    Output("table2_all_runs", "table", SETUP, build="setup:table2_all_runs", document=True,
           summary=True,
           inputs={"runs": ("train_log", "runs"), "geometry": ("geometry_summary", "runs")}),
    Output("table4", "table", SETUP, build="setup:table4", document=True, summary=True,
           inputs={"runs": ("train_log", "runs")}),
    Output("table5", "table", SETUP, build="setup:table5", summary=True,
           inputs={"runs": ("train_log", "runs"), "eval": ("eval", "runs")}),
    Output("figure1", "figure", SETUP, build="setup:figure1_data", draw="setup:figure1",
           inputs={"runs": ("train_log", "first_seeds"), "pk": ("pk", "first_seeds")}),
    # ---- §5.1 Exclusivity (exclusivity.py)
    Output("leakage", "table", EXCLUSIVITY, build="exclusivity:leakage",
           inputs={"leakage": ("leakage", "leakage")}),
    Output("figure2", "figure", EXCLUSIVITY, build="exclusivity:figure2_data",
           draw="exclusivity:figure2",
           inputs={"leakage": ("leakage", "leakage"), "pairs": ("exclusivity_pairs", None),
                   "runs": ("train_log", "leakage")}),
    # ---- §5.2 Concentration (concentration.py, loss.py, seeds.py, ablation.py)
    Output("table3", "table", CONCENTRATION, build="concentration:table3",
           inputs={"runs": ("train_log", "selection"), "robustness": ("robustness", "selection")}),
    Output("table6", "table", CONCENTRATION, build="concentration:table6", summary=True,
           inputs={"runs": ("train_log", "selection"), "summaries": ("summary", "selection")}),
    Output("table6_all_runs", "table", CONCENTRATION, build="concentration:table6_all_runs",
           document=True, summary=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs")}),
    Output("figure3", "figure", CONCENTRATION, build="concentration:figure3_data",
           draw="concentration:figure3",
           inputs={"runs": ("train_log", "selection"), "robustness": ("robustness", "selection")}),
    # Figure 4 plots its selection from the cross-model loss Parquet (told which: --models).
    Output("figure4", "figure", CONCENTRATION, build="loss:figure4_data",
           draw="loss:figure4", plots_models=True, inputs={"loss": ("loss", None)}),
    Output("counts", "table", CONCENTRATION, build="seeds:counts", document=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs"),
                   "conditions": ("conditions", "pairs"), "paired": ("paired", "paired_tasks")}),
    Output("seeds", "table", CONCENTRATION, build="seeds:seeds", document=True, summary=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs"),
                   "lanes": ("lanes", "runs"), "eval": ("eval", "runs")}),
    Output("ablation_atlas", "table", CONCENTRATION, build="ablation:ablation_atlas_table",
           inputs=_ATLAS),
    Output("ablation_atlas", "figure", CONCENTRATION, build="ablation:ablation_atlas_data",
           draw="ablation:ablation_atlas", inputs=_ATLAS),
    Output("ablation_modes", "table", CONCENTRATION, build="ablation:ablation_modes_table",
           inputs={"runs": ("train_log", "ablation_modes"), "modes": ("ablation_modes", None)}),
    # ---- §5.3 Lanes (lanes.py, clamps.py, dynamics.py)
    Output("lanes", "table", LANES, build="lanes:lanes",
           inputs={"runs": ("train_log", "runs"), "lanes": ("lanes", "runs")}),
    Output("lane_heads", "table", LANES, build="lanes:lane_heads",
           inputs={"runs": ("train_log", "runs"), "heads": ("heads", "runs")}),
    Output("figure5", "figure", LANES, build="lanes:figure5_data", draw="lanes:figure5",
           inputs={"runs": ("train_log", "selection"), "heads": ("heads", "selection"),
                   "lanes": ("lanes", "selection"), "eval": ("eval", "selection")}),
    Output("clamps", "table", LANES, build="clamps:clamps_table",
           inputs={"runs": ("train_log", "clamps"), "pairs": ("clamp_pairs", "clamp_pairs"),
                   "paths": ("clamp_paths", "clamp_both_orders"),
                   "lumped": ("clamp_lumped", "clamp_lumped")}),
    Output("figure6de", "figure", LANES, build="clamps:figure6de_data", draw="clamps:figure6de",
           inputs={"runs": ("train_log", "clamp_pairs"), "pairs": ("clamp_pairs", "clamp_pairs")}),
    Output("dynamics", "table", LANES, build="dynamics:dynamics_table",
           inputs={"runs": ("train_log", "dynamics_timeline"), "tau": ("tau", "dynamics_timeline"),
                   "value_gradients": ("value_gradients", "dynamics_timeline")}),
    Output("figure6abc", "figure", LANES, build="dynamics:figure6abc_data",
           draw="dynamics:figure6abc",
           inputs={"runs": ("train_log", "dynamics_timeline"),
                   "timeline": ("timeline", "dynamics_timeline")}),
    # ---- §5.4 Self-alignment (alignment.py)
    Output("scalar_ablation", "table", ALIGNMENT, build="alignment:scalar_ablation_table",
           inputs={"runs": ("train_log", "dynamics_ablation"),
                   "scalar_ablation": ("scalar_ablation", "dynamics_ablation")}),
    Output("figure7", "figure", ALIGNMENT, build="alignment:figure7_data",
           draw="alignment:figure7", inputs={"geometry": ("geometry_summary", "selection")}),
    # ---- Appendix B (clamps.py: Figure 8; edges.py; coordinates.py)
    Output("figure8", "figure", APPENDIX_B, build="clamps:figure8_data", draw="clamps:figure8",
           inputs={"runs": ("train_log", "clamps"), "paths": ("clamp_paths", "clamp_figure8"),
                   "both_orders": ("clamp_paths", "clamp_both_orders")}),
    Output("table7", "table", APPENDIX_B, build="edges:table7",
           inputs={"runs": ("train_log", "edges"), "summaries": ("edge_summary", "edges"),
                   "acdc": ("acdc", "acdc")}),
    Output("coordinates", "table", APPENDIX_B, build="coordinates:coordinates_table",
           inputs={"runs": ("train_log", "coordinates"),
                   "coordinates": ("coordinates", "coordinates")}),
    Output("coordinate_shares", "figure", APPENDIX_B, build="coordinates:coordinate_shares_data",
           draw="coordinates:coordinate_shares",
           inputs={"runs": ("train_log", "coordinates"),
                   "coordinates": ("coordinates", "coordinates"),
                   "directions": ("coordinate_directions", "coordinates")}),
)  # fmt: skip


def _by_name(kind: str) -> Mapping[str, Output]:
    by_name: dict[str, Output] = {}
    for record in (r for r in RECORDS if r.kind == kind):
        if record.name in by_name:
            raise ValueError(f"two paper {kind}s are called {record.name!r}")
        by_name[record.name] = record
    return MappingProxyType(by_name)


#: name -> record of every paper table and of every figure (a table and a figure may share
#: a name: the block ablation atlas is both).
TABLES: Mapping[str, Output] = _by_name("table")
FIGURES: Mapping[str, Output] = _by_name("figure")
#: The tables rule make_document builds in one job, and those make_table builds one each.
DOCUMENT_TABLES = tuple(n for n, o in TABLES.items() if o.document)
TABLE_JOBS = tuple(n for n, o in TABLES.items() if not o.document)


def record(kind: str, name: str) -> Output:
    """The record of paper ``kind`` (table or figure) ``name``; an unknown one is an error
    naming the known."""
    known = {"table": TABLES, "figure": FIGURES}[kind]
    if name not in known:
        raise KeyError(f"no paper {kind} {name!r}; known: {sorted(known)}")
    return known[name]


def section_order(section: str) -> int:
    """Where ``section`` stands in the paper (Table 4 lists a model's sections in this order)."""
    return SECTIONS.index(section)
