"""The SA-MoE study kind: config/samoe.yaml validates into a SAMoEStudy through the one
entry point of every study kind (headgeom.studies), every cross-key problem is one line
naming the key, and what each job hashes holds every [CHOICE] of its stage."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from headgeom.samoe.study import SAMoEStudy
from headgeom.studies import from_config
from headgeom.validation import StudyConfigError

ROOT = Path(__file__).resolve().parents[3]
DEMO = yaml.safe_load((ROOT / "config/samoe.yaml").read_text())
MICRO = yaml.safe_load((ROOT / "tests/e2e/samoe-micro.yaml").read_text())


def problems(config: dict) -> str:
    with pytest.raises(StudyConfigError) as err:
        from_config(config)
    return str(err.value)


def test_one_entry_point_knows_both_kinds():
    samoe = from_config(DEMO)
    assert isinstance(samoe, SAMoEStudy) and samoe.kind == "samoe"
    heads = from_config(yaml.safe_load((ROOT / "config/config.yaml").read_text()))
    assert heads.kind == "heads"
    with pytest.raises(StudyConfigError, match="kind: 'nosuch' is not a study kind; known: "
                                               "heads, samoe"):  # fmt: skip
        from_config({**DEMO, "kind": "nosuch"})


def test_demo_runs_and_blocks():
    s = from_config(DEMO)
    # 1 family × 3 seeds × 3 variants, seed by seed so a seed's variants sit together
    assert s.runs[:3] == [("toy", "ordinary", 42), ("toy", "latest", 42),
                          ("toy", "persistent", 42)]  # fmt: skip
    assert len(s.runs) == 9 and len(s.state_runs) == 6 and len(s.ordinary_runs) == 3
    assert s.n_layer("toy") == 8 and s.n_ctx("toy") == 128
    assert s.target_layers("toy") == [6, 7, 6, 7]
    assert s.probe_pairs("toy")[0] == (4, 5)
    run = s.run_config("toy", "persistent", "43")
    assert run["seed"] == 43 and run["moe"]["router_x_init"] == "state_block"
    assert run["cpt"]["aux"] == {"load_balance": 0.01, "z_loss": 0.001}
    # a seed's three variants hash different configs (the variant is part of the identity)
    assert s.run_config("toy", "latest", 42) != s.run_config("toy", "persistent", 42)


def test_defaults_are_filled_on_a_copy():
    given = copy.deepcopy(MICRO)
    s = from_config(given)
    assert given == MICRO  # not mutated
    assert s.config["moe"]["clamp"] == 5.0 and s.config["variants"] == list(
        ("ordinary", "latest", "persistent")
    )
    assert s.config["data"]["sampling"] == {"prose": 0.5, "code": 0.25, "math": 0.25}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["moe"].update(top_k=16), "config moe: samoe moe config: top_k=16"),
        (lambda c: c["cpt"].update(stepz=3), "unknown key 'stepz' (did you mean 'steps'?)"),
        (lambda c: c["probes"]["pairs"].append([5, 9]), "probe pair [5, 9] needs 0 ≤ source"),
        (lambda c: c["probes"]["long_horizon"].append([0, 1]), "[(0, 1)] are not probe pairs"),
        (lambda c: c["interventions"].update(target_layers=[8]), "target layer 8 needs"),
        (lambda c: c["data"]["sampling"].update(prose=0.9), "probabilities sum to 1.4, not 1"),
        (
            lambda c: c["interventions"].update(n_sequences=21),
            "interventions.n_sequences=21 differs from data.pools.intervention=24",
        ),
        (lambda c: c["probes"].update(budgets=[20000]), "the top budget 20000 exceeds"),
        (lambda c: c["interventions"].update(persistence_horizons=[7]), "before layer 0"),
        (lambda c: c["families"]["toy"]["dense"].update(d_head=12), "n_head·d_head == d_model"),
        (lambda c: c.update(variants=["ordinary", "lwo"]), "'lwo' is not allowed"),
        (lambda c: c["resources"].update(samoe_trian={"mem_mb": 100}), None),
        (
            lambda c: c["cpt"].update(precision="fp16"),
            "config cpt.precision: 'fp16' is not allowed",
        ),
        (
            lambda c: c["cpt"].update(microbatch={"latest": [4, 3]}),
            "config cpt.microbatch.latest [4, 3]: 1 rank(s) × 4 × 3 is not batch_size 8",
        ),
        (
            lambda c: c["cpt"].update(microbatch={"latest": [3, 3]}),
            "config cpt.microbatch.latest [3, 3] with 1 rank(s)",
        ),
        (lambda c: c["cpt"].update(global_batch_seqs=16), "global_batch_seqs 16 differs"),
    ],
)
def test_bad_configs_name_the_key(edit, message):
    config = copy.deepcopy(DEMO)
    config.setdefault("resources", {})
    edit(config)
    if message is None:  # a resources key that is no rule: caught against the workflow's rules
        study = from_config(config)
        with pytest.raises(StudyConfigError, match="samoe_trian.*did you mean 'samoe_train'"):
            study.check_rules(["samoe_train", "samoe_dense"])
        return
    assert message in problems(config)


def test_every_problem_is_reported_at_once():
    config = copy.deepcopy(DEMO)
    config["probes"]["pairs"].append([5, 9])
    config["data"]["sampling"]["prose"] = 0.9
    lines = problems(config).splitlines()
    assert len(lines) == 2


LOCAL_SOURCES = {d: {"files": [f"/data/{d}/*.parquet"], "format": "parquet"}
                 for d in ("prose", "code", "math")}  # fmt: skip


def _hub(config: dict) -> dict:
    """``config`` with one Hub family (SmolLM2) and its corpus keys."""
    config["families"] = {"smollm2": {"hf": {"repo_id": "HuggingFaceTB/SmolLM2-135M",
                                             "revision": "a" * 40}}}  # fmt: skip
    config["interventions"]["target_layers"] = [12, 16, 21, 25]
    config["data"].update(sources=copy.deepcopy(LOCAL_SOURCES), cpt_train_tokens=64 * 2048)
    config["downstream"] = {"tasks": ["hellaswag", "arc_easy", "piqa", "winogrande"],
                            "harness_commit": "b" * 40, "max_len": 2048}  # fmt: skip
    return config


def test_each_kind_of_family_gets_its_own_downstream_suite():
    hub = _hub(copy.deepcopy(DEMO))
    hub["downstream"]["tasks"] = ["piqa", "arith"]
    assert "['arith'] are toy tasks; the Hub families ['smollm2']" in problems(hub)
    hub = _hub(copy.deepcopy(DEMO))
    del hub["downstream"]["harness_commit"]
    assert "['harness_commit'] missing" in problems(hub)
    toy = copy.deepcopy(DEMO)
    toy["downstream"] = {"tasks": ["sva", "hellaswag"]}
    assert "['hellaswag'] are lm-eval tasks; the toy families ['toy']" in problems(toy)


def test_paper_family_has_the_published_shape():
    config = _hub(copy.deepcopy(DEMO))
    s = from_config(config)
    assert s.n_layer("smollm2") == 30 and s.n_ctx("smollm2") == 2048
    assert not s.is_toy("smollm2")
    config["families"]["smollm2"]["hf"]["repo_id"] = "org/unknown"
    assert "has no known shape" in problems(config)


def test_paper_study_requests_cover_the_flop_model():
    from headgeom.samoe.counts import cpt_flops, cpt_hours

    s = from_config(yaml.safe_load((ROOT / "config/samoe-paper.yaml").read_text()))
    cpt, moe = s.config["cpt"], s.moe_config()
    request = s.resources("samoe_train", mem_mb=1, runtime=1)
    assert request["gpu"] == 8
    for family in s.families:
        shape = s.paper_shape(family)
        # 3 × forward FLOPs per token × tokens: by hand for one case below
        hours = max(cpt_hours(shape, moe, v, cpt["steps"], cpt["global_batch_seqs"], 8)
                    for v in s.variants)  # fmt: skip
        assert request["runtime"] >= 60 * hours, (family, hours)
    gemma = s.paper_shape("gemma")
    tokens = 57220 * 256 * 2048
    from headgeom.samoe.counts import counts

    assert cpt_flops(gemma, moe, "persistent", 57220, 256) == pytest.approx(
        3 * counts(gemma, moe, "persistent").flops_per_token * tokens
    )
    assert len(s.runs) == 18 and s.n_layer("smollm2") == 30 and s.n_layer("gemma") == 18


def test_paper_runs_train_on_eight_ranks_with_each_variants_micro_batches():
    s = from_config(yaml.safe_load((ROOT / "config/samoe-paper.yaml").read_text()))
    assert s.train_ranks == 8
    assert s.train_launcher.startswith("torchrun --standalone --nproc_per_node=8 ")
    for variant, (micro, accumulation) in s.config["cpt"]["microbatch"].items():
        cpt = s.run_config("gemma", variant, 42)["cpt"]
        assert cpt["micro_batch"] == micro and cpt["precision"] == "bf16"
        assert 8 * micro * accumulation == cpt["batch_size"] == 256
    demo = from_config(DEMO)
    assert demo.train_launcher == "python"
    assert demo.run_config("toy", "latest", 42)["cpt"]["micro_batch"] == 0  # one pass


def test_hub_corpus_config_and_its_keys():
    s = from_config(_hub(copy.deepcopy(DEMO)))
    cfg = s.hub_corpus_config("smollm2")
    # the tokenizer is the dense import's own repository and revision
    assert cfg["tokenizer"] == s.import_config("smollm2")["hf"] and cfg["seq_len"] == 2048
    assert cfg["data"]["sources"] == LOCAL_SOURCES and cfg["data"]["cpt_train_tokens"] == 131072
    assert "dense_train_tokens" not in cfg["data"] and "val_tokens" not in cfg["data"]
    # the toy corpus's hashed config never sees the Hub keys (the toy demo's bytes)
    toy = from_config(DEMO)
    assert "sources" not in toy.corpus_config()["data"]
    mixed = _hub(copy.deepcopy(DEMO))
    mixed["families"]["toy"] = DEMO["families"]["toy"]
    mixed["interventions"]["target_layers"] = [6, 7, 6, 7]
    mixed["downstream"] = copy.deepcopy(DEMO["downstream"])  # one task list: the toy's
    pairs = [[14, 15]]
    mixed["families"]["smollm2"].update(target_layers=[12, 16, 21, 25], probe_pairs=pairs,
                                        long_horizon=pairs)  # fmt: skip
    m = from_config(mixed)
    expected = copy.deepcopy(toy.corpus_config())  # the toy corpus beside a Hub one: only the
    expected["data"]["cpt_train_tokens"] = 131072  # shared budget differs
    assert m.corpus_config() == expected
    assert m.hub_families == ["smollm2"] and m.toy_families == ["toy"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("sources"), "config data.sources: missing; the Hub families ['smollm2']"),
        (lambda d: d.update(cpt_train_tokens=1_000_000),
         "config data.cpt_train_tokens: 1000000 is not a multiple of 2048"),
        (lambda d: d["sources"]["code"].update(fmt="csv"),
         "config data.sources.code: unknown key 'fmt' (did you mean 'format'?)"),
        (lambda d: d["sources"]["math"].update(format="csv"),
         "config data.sources.math.format: 'csv' is not allowed"),
        (lambda d: d["sources"]["math"].update(config="x"),
         "config data.sources.math: local files take no Hub keys ['config']"),
        (lambda d: d["sources"].update(code={"text_column": "content"}), "data.sources.code"),
        (lambda d: d["sources"].update(prose={"repo_id": "x/y", "revision": "main"}),
         "data.sources.prose"),
        (lambda d: d["sources"].update(poetry={"repo_id": "x/y"}), "poetry"),
        (lambda d: d.update(batch_docs=0), "data.batch_docs"),
    ],
)  # fmt: skip
def test_bad_hub_corpus_keys_are_named(edit, message):
    config = _hub(copy.deepcopy(DEMO))
    edit(config["data"])
    assert message in problems(config)
