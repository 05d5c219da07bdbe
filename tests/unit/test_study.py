"""The study object (headgeom.heads.study) without Snakemake: good configs load with the schema's
defaults, bad ones give one short line per problem, and the study's answers (runs, corpora,
run configs, pairs, resources) are the ones worked out by hand from the config files."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from headgeom.heads.paper.outputs import record
from headgeom.heads.paper.plan import PaperPlan
from headgeom.heads.study import Study, StudyConfigError

REPO = Path(__file__).resolve().parents[2]


def models_of(runs) -> list[str]:
    """The models of a run set, each once, in run order."""
    return list(dict.fromkeys(m for m, _ in runs))


def load(name: str) -> dict:
    path = REPO / ("tests/e2e/micro.yaml" if name == "micro" else f"config/{name}.yaml")
    return yaml.safe_load(path.read_text())


def problems(config: dict) -> list[str]:
    with pytest.raises(StudyConfigError) as caught:
        Study.from_config(config)
    text = str(caught.value)
    assert text == "\n".join(caught.value.problems)
    assert "$schema" not in text and "description" not in text  # never the schema
    return text.splitlines()


@pytest.fixture
def micro() -> dict:
    return load("micro")


# ----------------------------------------------------------------------------- good configs
def test_demo_config_loads_with_the_schema_defaults():
    raw = load("config")
    study = Study.from_config(raw)
    assert raw == load("config")  # the caller's config is left as it was
    assert study.name == "demo"
    assert len(study.runs) == 9 and study.runs[:2] == [("learned", 42), ("learned", 43)]
    assert list(study.corpora) == ["default"] and study.default_corpus == "default"
    assert study.corpora["default"]["n_train_tokens"] == 1_000_000
    assert study.vocab_corpus == "default"  # compact_vocab defaults to true
    # defaults of the schema, filled in
    assert study.stage("patching") == {
        "splits": ["discovery", "validation", "evaluation"],  # holdout reserved (§16.1)
        "batch_size": 128,
        "max_rows": 4096,
        "mode": "resample",  # the paper's resample patching (docs §10.1)
    }
    assert study.stage("training")["checkpoint_steps"] == [0, 8, 32, 128, 512]  # docs §7.3
    assert study.stage("training")["precision"] == "auto"
    assert study.task_config("sva") == {"seed": 101, "prepend_eot": False}
    assert study.config["resources"] == {}
    # every paper table and figure has its models in the demo, in the paper's section order
    assert PaperPlan(study).tables == [
        *("table2", "table5"),  # §4
        "leakage",  # §5.1
        *("table3", "table6", "ablation_atlas", "ablation_modes"),  # §5.2, docs §10.6
        *("lanes", "lane_heads", "clamps", "dynamics"),  # §5.3, docs §13.3–13.4, §15.3
        "scalar_ablation",  # §5.4, docs §14.5
        *("table7", "coordinates"),  # App. B, docs §15.1–15.2
    ]
    assert PaperPlan(study).figures == [
        "figure1",  # §4
        "figure2",  # §5.1
        *("figure3", "figure4", "ablation_atlas"),  # §5.2
        *("figure5", "figure6de", "figure6abc"),  # §5.3
        "figure7",  # §5.4
        *("figure8", "coordinate_shares"),  # App. B
    ]


def test_demo_analyses():
    study = Study.from_config(load("config"))
    # paper §5.1: the demo measures leakage in its learned and write-common-axis seeds (4 runs)
    assert models_of(study.run_set("leakage")) == ["learned", "write-common-axis"]
    assert len(study.run_set("leakage")) == 4
    # without leakage.models: every model with free readers behind a shared LN_1
    config = load("config")
    del config["leakage"]["models"]
    assert models_of(Study.from_config(config).run_set("leakage")) == [
        "learned",
        "write-common-axis",
        "write-rotated",
        "write-common",  # the demo's training-dynamics model
    ]
    assert [p["pair_label"] for p in study.pairs] == [
        "all-common-axis s42 − all-rotated s42",
        "all-common-axis s42 − all-rotated-self s42",
        "write-rotated s42 − learned s42",
        "learned s42 − learned s43",
    ]
    assert study.pair_runs == [
        ("all-common-axis", 42),
        ("all-rotated", 42),
        ("all-rotated-self", 42),
        ("write-rotated", 42),
        ("learned", 42),
        ("learned", 43),
    ]
    # docs §7.3: the demo's checkpoints of steps 0, 8, 32, 128 and 512, then their manifests
    steps = ("000000", "000008", "000032", "000128", "000512")
    assert study.intermediate_checkpoints("c") == [
        *(f"c/step{s}.safetensors" for s in steps),
        *(f"c/step{s}.manifest.json" for s in steps),
    ]
    assert PaperPlan(study).paper_inputs("figure4", "figure") == {"loss": ("loss", None)}
    assert PaperPlan(study).paper_inputs("lanes") == {
        "runs": ("train_log", study.runs),
        "lanes": ("lanes", study.runs),
    }
    assert PaperPlan(study).figure_models("figure4") == study.loss_models
    assert PaperPlan(study).figure_models("figure3") == []


def test_paper_config_loads():
    study = Study.from_config(load("paper"))
    assert len(study.runs) == 21  # docs §6.1
    assert list(study.corpora) == ["R", "S"] and study.default_corpus == "R"
    assert study.corpora["S"]["sampling"] == "read_once"
    assert study.corpora["S"]["source"] == "fineweb"  # the source keys go to every corpus
    assert study.vocab_corpus is None  # the full GPT-2 vocabulary
    assert study.model_corpus("learned-s") == "S"
    assert models_of(study.run_set("leakage")) == ["learned-r", "learned-s", "write-common-axis"]
    cfg = study.train_config("learned-r", "42")
    assert cfg["seed"] == 42 and cfg["repository_name"] == "plain-learned42"
    assert cfg["corpus"] == "R" and cfg["display_name"] == "learned"
    assert "repository_name" in study.train_config("learned-r", 43)
    table3 = PaperPlan(study).selection(record("table", "table3"))
    assert len(table3) == 7  # the corpus-S models of Table 3
    assert PaperPlan(study).paper_inputs("table3")["robustness"] == ("robustness", table3)
    # 4H/3 = 16 heads: head indices are not the paper's lanes (docs §10.3)
    assert study.index_meaningful("learned-r") and not study.index_meaningful("write-routed-a")
    models = study.concentration_models()
    assert models["all-common-axis"]["reader_type"] == "block"
    assert models["learned-s"]["reader_type"] == "free"
    assert models["multiscreen-learned"]["reader_type"] == "free"
    assert models["write-routed-a"]["n_head"] == 16


def test_paper_resources():
    study = Study.from_config(load("paper"))
    # train: 1 GPU × 8 CPUs per GPU
    assert study.threads("train") == 8
    assert study.resources("train", mem_mb=4000, runtime=120) == {
        "mem_mb": 64000,
        "runtime": 720,
        "gpu": 1,
        "cpus_per_gpu": 8,
        # the step is signalled ahead of Slurm's kill so training saves its state (docs §2.4)
        "slurm_extra": "--signal=TERM@120",
    }
    assert study.threads("tokenize_corpus") == 16
    # a rule the config does not name: resources.default, then the rule's own fallbacks
    assert study.threads("lanes") == 1
    assert study.resources("lanes", mem_mb=1000, runtime=10) == {
        "mem_mb": 8000,
        "runtime": 60,
        "gpu": 0,
        "cpus_per_task": 1,
    }


def test_threads_are_capped_by_the_cpus_of_the_job(micro):
    micro["resources"] = {
        "default": {"threads": 2},
        "train": {"threads": 32, "cpus_per_task": 4, "slurm_partition": "gpu"},
        "lanes": {"cpus_per_task": 3},
    }
    study = Study.from_config(micro)
    assert study.threads("train") == 4
    assert study.resources("train", mem_mb=1, runtime=1)["slurm_partition"] == "gpu"
    assert study.threads("lanes") == 2  # default threads, below its 3 CPUs
    assert study.threads("patch_heads") == 2
    # no CPU request: the job asks Slurm for its threads
    assert study.resources("patch_heads", mem_mb=1, runtime=1)["cpus_per_task"] == 2


# ----------------------------------------------------------------------------- bad configs
def test_misspelled_top_level_key(micro):
    micro["trainig"] = micro.pop("training")
    lines = problems(micro)
    assert len(lines) <= 3
    assert lines[0].startswith("config: unknown key 'trainig' (did you mean 'training'?)")
    assert "allowed: kind, study, corpus, data_seed, architecture, models, training" in lines[0]
    assert "missing required key(s) training" in lines[1]


def test_unknown_geometry(micro):
    micro["models"]["learned"]["geometry"] = "all-rotatd"
    (line,) = problems(micro)
    assert line.startswith("config models.learned.geometry: 'all-rotatd' is not allowed")
    assert "(did you mean 'all-rotated'?)" in line
    assert "allowed: learned, write-common-axis," in line and "multiscreen-identity" in line


def test_misspelled_model_in_a_pair(micro):
    micro["concentration"]["pairs"] = [{"a": "write-common-axis", "b": "lerned"}]
    (line,) = problems(micro)
    assert line == (
        "config concentration.pairs[0].b: unknown model 'lerned' (did you mean 'learned'?); "
        "the study has ['learned', 'write-common-axis']"
    )


@pytest.mark.parametrize(
    ("path", "value", "expect"),
    [
        (("training", "steps"), 0, "config training.steps: 0 is not allowed; it must be ≥ 1"),
        (
            ("tasks", "sva", "splits", "evaluation"),
            10,
            "config tasks.sva.splits.evaluation: 10 is not allowed; it must be a multiple of 4",
        ),
        (("training", "betas"), [0.9], "config training.betas: [0.9] is not allowed; it must"),
        (("models", "learned", "seeds"), "1", "config models.learned.seeds: '1' is not allowed"),
        (("models", "Learned"), {"geometry": "learned", "seeds": [1]}, "key 'Learned'"),
        (("lanes", "split"), "holdout", "config lanes.split: 'holdout' is not allowed"),
        (("leakage", "models"), ["lerned"], "config leakage.models[0]: unknown model 'lerned'"),
        (("models", "learned", "corpus"), "R", "config models.learned.corpus is 'R'"),
        (("models", "learned", "repository_names"), {2: "x"}, "names seeds ['2']"),
        (
            ("resources", "train"),
            {"cpus_per_task": 2, "cpus_per_gpu": 2},
            "config resources.train sets both cpus_per_task (2) and cpus_per_gpu (2)",
        ),
    ],
)
def test_bad_value_gives_one_line_naming_the_key(micro, path, value, expect):
    node = micro
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    (line,) = problems(micro)
    assert expect in line, line


def test_every_cross_key_problem_is_reported_at_once(micro):
    micro["patching"]["splits"] = ["discovery"]
    micro["leakage"] = {"models": ["nope"]}
    lines = problems(micro)
    assert [line.split(" ")[1] for line in lines] == [
        "concentration.split",
        "leakage.split",
        "leakage.models[0]:",
        "clamps.split",  # clamps read evaluation effects too
    ]


def test_missing_key_and_unknown_nested_key(micro):
    del micro["architecture"]["n_ctx"]
    micro["training"]["lr_typo"] = 1.0
    lines = problems(micro)
    assert "config architecture: missing required key(s) n_ctx" in lines
    assert any(line.startswith("config training: unknown key 'lr_typo'") for line in lines)


def test_gpu_default_places_every_gpu_rule_and_no_other(micro):
    # one place for the GPU partition, model and CPUs per GPU; CPU rules never see it
    micro["resources"] = {
        "default": {"mem_mb": 900, "slurm_partition": "cpu", "cpus_per_task": 1},
        "gpu_default": {"slurm_partition": "gpu", "gpu_model": "a100", "cpus_per_gpu": 6},
        "train": {"gpu": 1},
        "edges": {"gpu": 2, "gpu_model": "h100"},
    }
    study = Study.from_config(micro)
    study.check_rules(["train", "edges", "lanes"])  # gpu_default is a scope, not a rule
    assert study.resources("train", mem_mb=1, runtime=1) == {
        "mem_mb": 900, "runtime": 1, "gpu": 1, "cpus_per_gpu": 6,
        "slurm_partition": "gpu", "gpu_model": "a100",
    }  # fmt: skip
    assert study.threads("train") == 6
    edges = study.resources("edges", mem_mb=1, runtime=1)
    assert (edges["gpu_model"], edges["cpus_per_gpu"], study.threads("edges")) == ("h100", 6, 12)
    assert study.resources("lanes", mem_mb=1, runtime=1) == {
        "mem_mb": 900, "runtime": 1, "gpu": 0, "cpus_per_task": 1, "slurm_partition": "cpu",
    }  # fmt: skip


def test_resource_keys_are_checked_against_the_rules(micro):
    micro["resources"] = {"default": {"mem_mb": 1000}, "patch_head": {"mem_mb": 1000}}
    study = Study.from_config(micro)  # the rules are known only to the workflow
    with pytest.raises(StudyConfigError) as caught:
        study.check_rules(["train", "patch_heads"])
    assert str(caught.value) == (
        "config resources.patch_head: 'patch_head' is not a rule (did you mean 'patch_heads'?); "
        "allowed: default, gpu_default, patch_heads, train"
    )
    micro["resources"] = {"default": {"mem_mb": 1000}, "train": {"mem_mb": 1000}}
    Study.from_config(micro).check_rules(["train"])


def test_only_learned_checkpoints_are_exported(micro):
    study = Study.from_config(micro)
    study.check_exportable("learned")
    with pytest.raises(ValueError, match="only 'learned'"):
        study.check_exportable("write-common-axis")


def test_a_geometry_impossible_at_the_size_fails_at_load(micro):
    bad = copy.deepcopy(micro)
    bad["models"]["routed"] = {"geometry": "write-routed-a", "seeds": [1]}  # 3 ∤ n_head = 2
    (line,) = problems(bad)
    assert line.startswith("config models.routed: ")


# ----------------------------------------------------------------------- clamps (docs §13.3, §15.3)
def test_clamp_runs_defaults_and_explicit_entries():
    study = Study.from_config(load("config"))
    assert study.run_set("clamp_pairs") == [
        ("learned", 42), ("learned", 43), ("write-common-axis", 42), ("write-common-axis", 43),
        ("write-rotated", 42), ("write-common", 42),  # the paper's common42 too (dynamics)
    ]  # fmt: skip
    assert study.run_set("clamp_lumped") == [("all-common-axis", 42)]
    # Figure 8: one run per slot geometry, first seed
    assert [m for m, _ in study.run_set("clamp_figure8")] == [
        "learned", "write-rotated", "all-common-axis", "all-rotated", "all-rotated-self"
    ]  # fmt: skip
    assert PaperPlan(study).selection(record("figure", "figure6de")) == study.run_set("clamp_pairs")
    paper = Study.from_config(load("paper"))
    assert paper.run_set("clamp_pairs") == [
        ("learned-r", 42), ("learned-s", 42), ("write-common-axis", 42), ("write-common", 42),
        ("write-rotated-r", 42),
    ]  # fmt: skip
    assert len(paper.run_set("clamp_both_orders")) == 5  # the five runs of docs §11.1
    assert paper.run_set("clamp_lumped") == [("all-common-axis", 42)]


def test_clamp_runs_refuse_unknown_models_and_seeds():
    raw = load("config")
    raw["clamps"] = {"pairs_models": ["lerned"]}
    with pytest.raises(StudyConfigError, match=r"clamps.pairs_models\[0\].*'lerned'.*learned"):
        Study.from_config(raw)
    raw["clamps"] = {"lumped_models": [{"model": "learned", "seeds": [7]}]}
    with pytest.raises(StudyConfigError, match="has seeds"):
        Study.from_config(raw)
    raw["clamps"] = {"split": "holdout"}
    with pytest.raises(StudyConfigError, match="clamps.split"):
        Study.from_config(raw)


# ------------------------------------------------------------------ imported models
def _imported_study(tmp_path, **import_block):
    import copy

    import yaml

    from headgeom.heads.study import Study

    cfg = yaml.safe_load((Path(__file__).parents[1] / "e2e" / "import.yaml").read_text())
    cfg = copy.deepcopy(cfg)
    cfg["models"]["gpt2-tiny"]["import"].update(import_block)
    return Study.from_config(cfg)


def test_an_imported_model_reads_its_sizes_from_config_json(tmp_path):
    from headgeom.model.importing import GPT2_VOCAB_SIZE

    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 3, "n_head": 4, "n_embd": 32, '
        '"vocab_size": 50257, "n_positions": 64}'
    )
    (d / "model.safetensors").write_bytes(b"")
    study = _imported_study(tmp_path, path=str(d))
    assert study.imported_models == ["gpt2-tiny"] and study.trained_models == []
    mc = study.model_config("gpt2-tiny")
    assert (mc["n_layer"], mc["n_head"], mc["d_head"], mc["d_mlp"]) == (3, 4, 8, 128)
    assert mc["n_vocab"] == GPT2_VOCAB_SIZE and mc["geometry"] == "learned"
    run = study.import_config("gpt2-tiny", 0)
    assert run["import"]["allow_pickle"] is False and "training" not in run
    import re

    assert re.fullmatch(study.model_pattern(study.trained_models), "gpt2-tiny") is None


def test_an_imported_model_that_is_not_there_or_not_gpt2_is_named(tmp_path):
    from headgeom.heads.study import StudyConfigError

    with pytest.raises(StudyConfigError, match=r"models\.gpt2-tiny\.import: .*not a directory"):
        _imported_study(tmp_path, path=str(tmp_path / "absent"))
    d = tmp_path / "bert"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(StudyConfigError, match="model_type is 'bert', not 'gpt2'"):
        _imported_study(tmp_path, path=str(d))
    with pytest.raises(StudyConfigError, match="format"):
        _imported_study(tmp_path, path=str(d), format="onnx")


# ----------------------------------------------------------------------- dynamics (docs §13.2–14.5)
def test_demo_dynamics_runs_and_steps():
    study = Study.from_config(load("config"))
    assert study.run_set("dynamics_timeline") == [("write-common", 42)]
    assert study.run_set("dynamics_ablation") == [
        ("write-common-axis", 42),
        ("write-common-axis", 43),
    ]
    assert study.checkpoint_steps == [0, 8, 32, 128, 512]
    assert study.timeline_steps == [32, 128, 512]
    assert study.dynamics_checkpoint_steps == [0, 8, 32, 128, 512]
    assert study.step_label(8) == "000008"
    assert study.ablation_edits() == ["scalar", *(f"random{k}" for k in range(5))]
    assert study.ablation_layers("write-common-axis") == [1]  # 1 .. L // 3 of 4 layers


def test_paper_dynamics_defaults_are_the_papers_models():
    study = Study.from_config(load("paper"))
    # docs §13.2: common42 and layered42 (corpus R); §14.5: the five identity-type models
    assert study.run_set("dynamics_timeline") == [("write-common", 42), ("write-rotated-r", 42)]
    ablation = [study.repository_name(m, s) for m, s in study.run_set("dynamics_ablation")]
    assert ablation == [
        "plain-identity42",
        "plain-identity43",
        "fixeddiag42",
        "value384",
        "mlp3456",
    ]
    assert study.timeline_steps == [256, 1024, 4096, 16384]
    assert study.ablation_layers("fixeddiag") == [1, 2, 3, 4]  # docs §14.5


@pytest.mark.parametrize(
    "path, value, expect",
    [
        (("training", "checkpoint_steps"), [0, 8, 1250], "checkpoint_steps [1250] are not below"),
        (("dynamics", "timeline_steps"), [8, 33], "timeline_steps [33] are not intermediate"),
        (("dynamics", "value_gradient_steps"), [0, 9], "value_gradient_steps [9] are not"),
        (("dynamics", "ablation_layers"), [1, 4], "ablation_layers [4] do not exist"),
        (("dynamics", "ablation_draws"), 0, "ablation_draws: 0 is not allowed"),
        (("dynamics", "models"), ["write-comon"], "did you mean 'write-common'"),
    ],
)
def test_bad_dynamics_config_is_refused(path, value, expect):
    config = load("config")
    config[path[0]][path[1]] = value
    with pytest.raises(StudyConfigError, match=re.escape(expect)):
        Study.from_config(config)


def test_default_checkpoint_steps_past_the_end_are_cut_not_refused():
    config = load("config")
    del config["training"]["checkpoint_steps"]
    del config["dynamics"]
    config["training"]["steps"] = 300  # the default list [0, 256, 1024, ...] runs past it
    study = Study.from_config(config)
    assert study.checkpoint_steps == [0, 256]


# ----------------------------------------------------------------------------- per-model steps
def test_a_model_can_train_longer_than_training_steps(micro):
    micro["training"]["checkpoint_steps"] = [0]
    first, *_ = micro["models"]
    micro["models"][first]["steps"] = 3 * micro["training"]["steps"]
    study = Study.from_config(micro)
    own = study.train_config(first, micro["models"][first]["seeds"][0])["training"]
    assert own["steps"] == 3 * micro["training"]["steps"]
    same = ("steps", "checkpoint_steps")  # checkpoint_steps: see the next test
    assert {k: v for k, v in own.items() if k not in same} == {
        k: v for k, v in study.config["training"].items() if k not in same
    }
    others = [m for m in study.models if m != first]
    for model in others:  # the others keep training.steps
        theirs = study.train_config(model, study.models[model]["seeds"][0])["training"]
        assert theirs["steps"] == study.config["training"]["steps"]
        assert {k: v for k, v in theirs.items() if k != "checkpoint_steps"} == {
            k: v for k, v in study.config["training"].items() if k != "checkpoint_steps"
        }


def test_only_timeline_models_keep_intermediate_checkpoints():
    # rule dynamics reads the timeline runs' checkpoints; nothing reads the others'
    study = Study.from_config(load("config"))
    assert study.timeline_models == ["write-common"]
    for model in study.models:
        steps = study.train_config(model, study.models[model]["seeds"][0])["training"]
        want = study.config["training"]["checkpoint_steps"] if model == "write-common" else []
        assert steps["checkpoint_steps"] == want, model
    assert study.config["training"]["checkpoint_steps"] == [0, 8, 32, 128, 512]


def test_a_models_steps_may_not_add_checkpoints_the_others_lack(micro):
    steps = micro["training"]["steps"]
    micro["training"]["checkpoint_steps"] = [0, steps + 1]
    first, *_ = micro["models"]
    micro["models"][first]["steps"] = steps + 5
    lines = problems(micro)
    assert any(
        f"config models.{first}.steps {steps + 5}: checkpoint steps [{steps + 1}]" in line
        for line in lines
    ), lines


def test_edge_examples_must_fit_their_split(micro):
    micro["edges"]["n_examples"] = 9  # the micro validation split holds 8
    lines = problems(micro)
    assert any(
        "config edges.n_examples is 9 but tasks.sva.splits.validation holds 8 examples" in line
        for line in lines
    ), lines
