"""Every paper table and figure, one record each (:class:`headgeom.heads.paper.output.Output`),
in the paper's order of sections. The workflow, the document and the report read them
here; nothing adds to them after this module is loaded.

Each record names its inputs by kind: ``kind -> (result, run set)``, the result a path
template of the workflow (headgeom.paths.TEMPLATES) and the run set the runs it is
read for (``headgeom.heads.paper.plan.PaperPlan.paper_inputs``; None: one cross-run file).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from headgeom.heads.paper.output import (
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
           },
           caption=("Paper Table 1 (summary): each property studied, its operational "
                    "definition and this study's finding, written from the result Parquets; a "
                    "property whose analysis the study does not run says 'not in this study'.")),
    # every kind one of the comparison's recipes asks for (headgeom.heads.paper.recipes)
    Output("comparison", "table", SUMMARY, build="summary:comparison", document=True,
           summary=True,
           inputs={
               "runs": ("train_log", "runs"),
               "summaries": ("summary", "runs"),
               "robustness": ("robustness", "runs"),
               "conditions": ("conditions", "pairs"),
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
           },
           caption=("Paper vs this run (summary): every reference number of METHODS §20 beside "
                    "this run's value, computed from the result Parquets, and whether it lies "
                    "within the paper's range.")),
    # every logged acceptance check (docs §18)
    Output("checks", "table", SUMMARY, build="summary:checks", document=True, summary=True,
           inputs={"checks": ("checks", None)},
           caption=("Numerical acceptance checks (docs §18): every check C1–C16 that a job of "
                    "the DAG logged in the metadata of its output, with the designed PKs of "
                    "§9.4 and the validation-loss ordering of §7.3 — per check the artifacts "
                    "that log it, the largest residual, its tolerance and how many pass. Read "
                    "from ``checks.parquet`` (rule ``checks``, which gathers the logged "
                    "residuals); the CSV keeps one row per check and artifact.")),
    # ---- §4 Setup (setup.py)
    Output("table2", "table", SETUP, build="setup:table2_paper",
           inputs={"runs": ("train_log", "selection"), "all_runs": ("train_log", "runs")},
           caption=("Paper Table 2 (§4): the ten main-text models (seed 42 shown): write map, "
                    "readers, corpus, parameters, validation loss and Δ vs the learned model "
                    "on the same corpus; the footnote states reader kinds, g and the seeds.")),
    Output("table2_all_runs", "table", SETUP, build="setup:table2_all_runs", document=True,
           summary=True,
           inputs={"runs": ("train_log", "runs"), "geometry": ("geometry_summary", "runs")},
           caption=("Table 2 for every run (extra view, §4): parameters, loss, Δ vs learned "
                    "and each run's weight-space geometry (write–write PK, own-best fraction, "
                    "ρ_self, Proposition 1 residual), block-reader models included.")),
    Output("table4", "table", SETUP, build="setup:table4", document=True, summary=True,
           inputs={"runs": ("train_log", "runs")},
           caption=("Paper Table 4 (§4): every configuration of the study with write map / "
                    "readers, corpus, exact parameter count, validation loss and the paper "
                    "sections whose outputs use it.")),
    Output("table5", "table", SETUP, build="setup:table5", summary=True,
           inputs={"runs": ("train_log", "runs"), "eval": ("eval", "runs")},
           caption=("Paper Table 5 (§4): clean accuracy and mean logit margin per model and "
                    "task on the evaluation split.")),
    Output("figure1", "figure", SETUP, build="setup:figure1_data", draw="setup:figure1",
           inputs={"runs": ("train_log", "first_seeds"), "pk": ("pk", "first_seeds")},
           caption=("Paper Figure 1 (§4): shared-dimension PK between the write subspaces of "
                    "heads in different layers, one heat map per model (its first seed); "
                    "same-layer blocks masked.")),
    # ---- §5.1 Exclusivity (exclusivity.py)
    Output("leakage", "table", EXCLUSIVITY, build="exclusivity:leakage",
           inputs={"leakage": ("leakage", "leakage")},
           caption=("Leakage (§5.1): L of a head's patch perturbation into later readers, L/ρ "
                    "against the isotropic expectation ρ and Spearman(L, ρ), per model and "
                    "read type.")),
    Output("figure2", "figure", EXCLUSIVITY, build="exclusivity:figure2_data",
           draw="exclusivity:figure2",
           inputs={"leakage": ("leakage", "leakage"), "pairs": ("exclusivity_pairs", None),
                   "runs": ("train_log", "leakage")},
           needs="leakage",
           caption=("Paper Figure 2 (§5.1): measured leakage L of every source → later-reader "
                    "pair against its isotropic expectation ρ (grey density), the "
                    "evaluation-selected top pairs coloured by read type, and y = x.")),
    # ---- §5.2 Concentration (concentration.py, loss.py, seeds.py, ablation.py)
    Output("table3", "table", CONCENTRATION, build="concentration:table3",
           inputs={"runs": ("train_log", "selection"), "robustness": ("robustness", "selection")},
           caption=("Paper Table 3 (§5.2): ``N_eff = N_index × N_layer|index`` per model and "
                    "task, the index-level permutation null, N_eff from the per-example "
                    "absolute effects and the pairs whose order reverses under them.")),
    Output("table6", "table", CONCENTRATION, build="concentration:table6", summary=True,
           inputs={"runs": ("train_log", "selection"), "summaries": ("summary", "selection")},
           caption=("Paper Table 6 (§5.2): N_eff and E of the head-patching effects per model "
                    "and task on the evaluation split, for the paper's 13 rows (corpus R "
                    "learned and write-common-axis with both seeds, then the corpus-S models); "
                    "the footnote names the rows the study lacks, every run is in "
                    "table6_all_runs.")),
    Output("table6_all_runs", "table", CONCENTRATION, build="concentration:table6_all_runs",
           document=True, summary=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs")},
           caption=("Table 6 for every run (extra view, §5.2): N_eff and E of the "
                    "head-patching effects per run and task on the evaluation split, corpus R "
                    "first; paper Table 6 itself shows the paper's 13 rows.")),
    Output("figure3", "figure", CONCENTRATION, build="concentration:figure3_data",
           draw="concentration:figure3",
           inputs={"runs": ("train_log", "selection"), "robustness": ("robustness", "selection")},
           caption=("Paper Figure 3 (§5.2): N_eff of the head-patching effects per task for "
                    "the Figure 3 models with 95% bootstrap percentile intervals; a model with "
                    "several seeds shows its seed mean as the bar and each seed as a dot with "
                    "its own interval.")),
    # Figure 4 plots its selection from the cross-model loss Parquet (told which: --models).
    Output("figure4", "figure", CONCENTRATION, build="loss:figure4_data",
           draw="loss:figure4", plots_models=True, inputs={"loss": ("loss", None)},
           caption=("Paper Figure 4 (§5.2): validation loss against geometric-mean N_eff, "
                    "marker by reader type (registry), open markers for models with more heads "
                    "per layer; the seeds of one model are joined, × marks their mean; "
                    "Spearman correlations in the title.")),
    Output("counts", "table", CONCENTRATION, build="seeds:counts", document=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs"),
                   "conditions": ("conditions", "pairs"), "paired": ("paired", "paired_tasks")},
           caption=("Counts of §5.2 (docs §12.1, §12.5): model–task comparisons with N_eff "
                    "below the learned model's, and conditions in which one model is more "
                    "concentrated than another.")),
    Output("seeds", "table", CONCENTRATION, build="seeds:seeds", document=True, summary=True,
           inputs={"runs": ("train_log", "runs"), "summaries": ("summary", "runs"),
                   "lanes": ("lanes", "runs"), "eval": ("eval", "runs")},
           caption=("Seed-level statistics (§5.2): for every configuration with two or more "
                    "seeds, seed means of N_eff, E, Λ and accuracy with 95% Student-t "
                    "intervals, and paired seed contrasts between such models.")),
    Output("ablation_atlas", "table", CONCENTRATION, build="ablation:ablation_atlas_table",
           inputs=_ATLAS,
           needs="ablation_atlas",
           caption=("Block ablation atlas (ablation modes): per model the blocks with the "
                    "largest zero-ablation KL on held-out validation text, with mean ablation "
                    "beside them, the write's size and constant part; the CSV holds every "
                    "block.")),
    Output("ablation_atlas", "figure", CONCENTRATION, build="ablation:ablation_atlas_data",
           draw="ablation:ablation_atlas", inputs=_ATLAS,
           needs="ablation_atlas",
           caption=("Block ablation atlas: layers × blocks (attention, MLP, each head) per "
                    "model, zero ablation beside mean ablation; colour is KL(original ‖ "
                    "edited) on held-out validation text (log scale), circle area the write's "
                    "constant part ‖mean w‖²/mean‖w‖² (a full circle: a fixed bias).")),
    Output("ablation_modes", "table", CONCENTRATION, build="ablation:ablation_modes_table",
           inputs={"runs": ("train_log", "ablation_modes"), "modes": ("ablation_modes", None)},
           needs="ablation_modes",
           caption=("Ablation modes: concentration of the head-patching effects per mode "
                    "(resample, mean, zero) per model and task: N_eff and its ratio to "
                    "resample, E, top-head share, N_index × N_layer|index, Λ and the Spearman "
                    "ρ of per-head effects against resample.")),
    # ---- §5.3 Lanes (lanes.py, clamps.py, dynamics.py)
    Output("lanes", "table", LANES, build="lanes:lanes",
           inputs={"runs": ("train_log", "runs"), "lanes": ("lanes", "runs")},
           caption=("Lanes (§5.3): lane score Λ of same-index heads with its permutation "
                    "p-value, Bonferroni-corrected over the three tasks; runs beyond the "
                    "paper's Λ runs are marked extra.")),
    Output("lane_heads", "table", LANES, build="lanes:lane_heads",
           inputs={"runs": ("train_log", "runs"), "heads": ("heads", "runs")},
           caption=("Lanes (§5.3): the top-3 heads by discovery effect, whether they stay "
                    "positive on the evaluation split, and whether two share a head index.")),
    Output("figure5", "figure", LANES, build="lanes:figure5_data", draw="lanes:figure5",
           inputs={"runs": ("train_log", "selection"), "heads": ("heads", "selection"),
                   "lanes": ("lanes", "selection"), "eval": ("eval", "selection")},
           caption=("Paper Figure 5 (§5.3): per-head effects e_(l,h) per model and task "
                    "(discovery split) on one asinh colour scale, layer 0 at the bottom; the "
                    "ring marks the largest drop (largest signed e); titles give that head's "
                    "share of E, the base logit difference, N_eff and Λ with its p.")),
    Output("clamps", "table", LANES, build="clamps:clamps_table",
           inputs={"runs": ("train_log", "clamps"), "pairs": ("clamp_pairs", "clamp_pairs"),
                   "paths": ("clamp_paths", "clamp_both_orders"),
                   "lumped": ("clamp_lumped", "clamp_lumped")},
           shows="clamps",
           caption=("Clamps (§5.3, App. B.3): single-head, later-MLP and lumped lane clamp "
                    "reductions, and the path-decomposition shares, beside the paper's values.")),
    Output("figure6de", "figure", LANES, build="clamps:figure6de_data", draw="clamps:figure6de",
           inputs={"runs": ("train_log", "clamp_pairs"), "pairs": ("clamp_pairs", "clamp_pairs")},
           shows="clamp_pairs",
           caption=("Paper Figure 6d–e (§5.3): reduction of an earlier top head's effect when "
                    "the later top head (d) or every later MLP (e) is clamped; same-index "
                    "pairs in blue.")),
    Output("dynamics", "table", LANES, build="dynamics:dynamics_table",
           inputs={"runs": ("train_log", "dynamics_timeline"), "tau": ("tau", "dynamics_timeline"),
                   "value_gradients": ("value_gradients", "dynamics_timeline")},
           shows="dynamics_timeline",
           caption=("Training dynamics (§13.4, §14.4): task-gradient alignment τ per "
                    "checkpoint (adjacent-layer cosines, same-index projected cosines, "
                    "gradient lane share) and the V-gradient own-term fractions per traced "
                    "checkpoint with the sign of tr(V_hᵀO_h) per layer at the final one, "
                    "beside the paper's values.")),
    Output("figure6abc", "figure", LANES, build="dynamics:figure6abc_data",
           draw="dynamics:figure6abc",
           inputs={"runs": ("train_log", "dynamics_timeline"),
                   "timeline": ("timeline", "dynamics_timeline")},
           shows="dynamics_timeline",
           caption=("Paper Figure 6a–c (§5.3, §5.4): along training, SVA evaluation accuracy, "
                    "lane score Λ and V self-alignment (own-best fraction, scaled idempotence "
                    "P(T_h)) at each intermediate checkpoint of the timeline runs; chance "
                    "lines dotted.")),
    # ---- §5.4 Self-alignment (alignment.py)
    Output("scalar_ablation", "table", ALIGNMENT, build="alignment:scalar_ablation_table",
           inputs={"runs": ("train_log", "dynamics_ablation"),
                   "scalar_ablation": ("scalar_ablation", "dynamics_ablation")},
           shows="dynamics_ablation",
           caption=("Scalar-part ablation (§14.5): drop in evaluation mean logit difference "
                    "when the scalar part s·I is removed from the own-lane value maps, against "
                    "equal-norm Haar-random parts (mean and range over the draws), and the "
                    "count of cases where the scalar ablation hurts more (paper: 13 of 15).")),
    Output("figure7", "figure", ALIGNMENT, build="alignment:figure7_data",
           draw="alignment:figure7", inputs={"geometry": ("geometry_summary", "selection")},
           caption=("Paper Figure 7 (§5.4): own-best fraction of V self-alignment of the "
                    "free-reader models (layers ≥ 1 and layer 0, chance 1/H) and mean ρ_self "
                    "(chance d/D); block-reader designs, whose V read space is their write "
                    "space by construction, are left out (their values are in "
                    "table2_all_runs).")),
    # ---- Appendix B (clamps.py: Figure 8; edges.py; coordinates.py)
    Output("figure8", "figure", APPENDIX_B, build="clamps:figure8_data", draw="clamps:figure8",
           inputs={"runs": ("train_log", "clamps"), "paths": ("clamp_paths", "clamp_figure8"),
                   "both_orders": ("clamp_paths", "clamp_both_orders")},
           shows="clamp_figure8",
           caption=("Paper Figure 8 (App. B.3): two-order path decomposition of the top-5 SVA "
                    "head effects: direct, via MLPs and via later attention (order A), and "
                    "both orders' shares.")),
    Output("table7", "table", APPENDIX_B, build="edges:table7",
           inputs={"runs": ("train_log", "edges"), "summaries": ("edge_summary", "edges"),
                   "acdc": ("acdc", "acdc")},
           needs="edges",
           caption=("Paper Table 7 (App. B.1): Spearman between an edge's weight-space PK and "
                    "its KL(P_clean ‖ P_patched) on the first 16 SVA validation examples, "
                    "pooled and within (reader, X) for Q, K and V, rows grouped as the paper "
                    "with the paper's values; second block: the ACDC circuit's incoming edges "
                    "to attention inputs by source type (App. B.4).")),
    Output("coordinates", "table", APPENDIX_B, build="coordinates:coordinates_table",
           inputs={"runs": ("train_log", "coordinates"),
                   "coordinates": ("coordinates", "coordinates")},
           needs="coordinates",
           caption=("Coordinate concentration (App. B.2): top-10 single-direction share of the "
                    "positive evaluation drop at the best head's layer, after W_O, before W_O "
                    "and before W_O after a within-head Haar rotation, directions chosen on "
                    "validation; the paper's SVA value in brackets and how often the selected "
                    "set beats every magnitude-matched random set.")),
    Output("coordinate_shares", "figure", APPENDIX_B, build="coordinates:coordinate_shares_data",
           draw="coordinates:coordinate_shares", needs="coordinates",
           inputs={"runs": ("train_log", "coordinates"),
                   "coordinates": ("coordinates", "coordinates"),
                   "directions": ("coordinate_directions", "coordinates")},
           caption=("Coordinate concentration (App. B.2): cumulative share of the positive "
                    "evaluation drop in single directions taken in validation order, per task "
                    "and site (after W_O, before W_O, Haar-rotated), one line per run; at k = "
                    "10 the dot is the reported share and × the 95th percentile of "
                    "magnitude-matched random sets.")),
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
