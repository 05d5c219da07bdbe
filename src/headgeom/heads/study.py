"""The study a config describes: :meth:`Study.from_config` checks a config (``config/*.yaml``)
against the schema (:mod:`headgeom.validation`) and across keys, and answers the workflow's
questions about it: its runs (model, seed), corpora, run configs, the runs of each analysis
(:meth:`Study.run_set`, :mod:`headgeom.heads.run_sets`), pairs, per-stage config blocks and
per-rule resources (:mod:`headgeom.resources`). Which paper tables and figures it makes is
:mod:`headgeom.heads.paper.plan`'s.

A config it cannot run raises :class:`StudyConfigError`, one short line per problem.
Defaults are filled as Snakemake's ``validate`` fills them, on a copy: ``Study.config`` is
the config the workflow runs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from functools import cached_property, partial
from pathlib import Path

from headgeom.data import lexicon
from headgeom.heads import run_sets, selections
from headgeom.model import facts, zoo
from headgeom.resources import ResourceRequests
from headgeom.studies import KINDS
from headgeom.validation import (
    StudyConfigError,
    did_you_mean,
    import_problems,
    load_schema,
    run_checks,
    validate,
)
from headgeom.vocabulary import TASKS

#: Per-corpus keys: at the top of `corpus` for a single corpus, else per named corpus.
_PER_CORPUS_KEYS = ("n_train_tokens", "order", "sampling")
#: The head-geometry study's config schema (workflow/schemas/heads.schema.yaml).
SCHEMA = KINDS["heads"].schema_path
#: What other modules import from here (StudyConfigError: the schema check's, re-exported).
__all__ = ["TASKS", "Study", "StudyConfigError"]


#: The geometry of every imported model (a checkpoint the user brings): GPT-2's own, free readers.
IMPORTED_GEOMETRY = facts.IMPORTED_GEOMETRY


# ----------------------------------------------------------------------------- study
class Study(ResourceRequests):
    """A checked study config. Build it with :meth:`from_config`."""

    kind = "heads"

    def __init__(self, config: dict):
        self.config = config
        self.name: str = config["study"]
        self.models: dict[str, dict] = config["models"]
        self._model_configs: dict[str, dict] = {}
        self._run_sets: dict[str, list[tuple[str, int]]] = {}
        for spec in self.models.values():  # an imported model is `learned`
            if "import" in spec:
                spec.setdefault("geometry", IMPORTED_GEOMETRY)

    @classmethod
    def from_config(cls, config: Mapping, schema: str | Path | Mapping = SCHEMA) -> Study:
        """Validate ``config`` (a copy, defaults filled), run every cross-key check and return
        the study; raise :class:`StudyConfigError` listing every problem found. A config of
        any kind: :func:`headgeom.studies.from_config`."""
        original, config = config, copy.deepcopy(dict(config))
        schema = schema if isinstance(schema, Mapping) else load_schema(schema)
        problems = validate(config, schema) + import_problems(config)  # recipe or import
        if problems:  # the cross-key checks assume a config of the right shape
            raise StudyConfigError(problems)
        study = cls(config)
        # explicit checkpoint steps are checked; the schema's default list is cut
        study._given_checkpoint_steps = dict(original.get("training") or {}).get("checkpoint_steps")
        run_checks(study._checks())
        return study

    def _checks(self):
        """Every cross-key check, each raising ValueError with one line."""
        yield self._check_corpora
        yield from (partial(self._check_model, model) for model in self.models)
        yield from (
            partial(self._check_split, key) for key in ("concentration", "lanes", "leakage")
        )
        # the runs the analyses name (computed once, here)
        yield lambda: self.run_set("leakage")
        yield lambda: self.pairs
        yield lambda: self.loss_models
        yield partial(self._check_split, "clamps")  # clamps (docs §13.3, §15.3)
        yield lambda: self.run_set("clamps")
        yield lambda: (self.run_set("ablation_modes"), self.run_set("ablation_atlas"))
        yield self._check_ablation_windows
        yield self._check_resources
        yield from self._dynamics_checks()  # training dynamics (docs §13.2, §14.5)
        yield self._check_edge_examples  # edges (docs §15.1)
        yield lambda: self.task_tokenizer  # tasks under an imported causal LM's tokenizer

    # ------------------------------------------------------------------ stages and runs
    def stage(self, name: str) -> dict:
        """A stage's config block (patching, leakage, lanes, concentration, training, ...),
        defaults filled."""
        return self.config[name]

    def task_config(self, task: str) -> dict:
        return self.config["tasks"][task]

    def run_set(self, name: str) -> list[tuple[str, int]]:
        """The runs of run set ``name`` (``headgeom.heads.run_sets.RUN_SETS``: ``leakage``,
        ``clamp_pairs``, ``edges``, ...), in config order, resolved once."""
        if name not in self._run_sets:
            self._run_sets[name] = run_sets.resolve(self, name)
        return self._run_sets[name]

    @cached_property
    def skipped_analyses(self) -> list[dict[str, str]]:
        """``{run_set, model, reason}`` of every analysis whose default leaves out an imported
        model because its architecture lacks the engine (``headgeom.heads.run_sets.skipped``); the
        workflow prints them when it starts."""
        return run_sets.skipped(self)

    @cached_property
    def runs(self) -> list[tuple[str, int]]:
        """(model, seed) of every run, in config order."""
        return [(m, int(s)) for m, spec in self.models.items() for s in spec["seeds"]]

    @cached_property
    def first_seed_runs(self) -> list[tuple[str, int]]:
        """One run per model: its first configured seed."""
        return [(m, int(spec["seeds"][0])) for m, spec in self.models.items()]

    def repository_name(self, model: str, seed: int | str) -> str | None:
        """The repository name of (model, seed) from ``repository_names``, or None."""
        names = self.models[model].get("repository_names", {})
        return names.get(int(seed), names.get(str(seed)))

    def _check_model(self, model: str) -> None:
        spec = self.models[model]
        extra = {str(s) for s in spec.get("repository_names", {})} - {str(s) for s in spec["seeds"]}
        if extra:
            raise ValueError(
                f"config models.{model}.repository_names names seeds {sorted(extra)} that "
                f"are not in its seeds {spec['seeds']}"
            )
        self.model_config(model)  # a geometry impossible at this size fails before any job

    # ------------------------------------------------------------------ run configs
    def model_config(self, model: str) -> dict:
        """The model section of a run config: the geometry sized for the study's architecture,
        every choice explicit (headgeom.model.zoo.derive_model_config)."""
        if model not in self._model_configs and self.is_imported(model):
            self._model_configs[model] = self._imported_model_config(model)
        if model not in self._model_configs:
            spec = self.models[model]
            try:
                self._model_configs[model] = zoo.derive_model_config(
                    spec["geometry"], self.config["architecture"], spec.get("geometry_params")
                )
            except ValueError as err:
                raise ValueError(f"config models.{model}: {err}") from None
        return self._model_configs[model]

    def train_config(self, model: str, seed: int | str) -> dict:
        """The run config of (model, seed): what heads/stages/train.py and
        heads/stages/hash_checkpoint.py take."""
        spec = self.models[model]
        cfg = {
            "model_name": model,
            "seed": int(seed),
            "data_seed": self.config["data_seed"],
            "model": self.model_config(model),
            "training": self.training_of(model),
        }
        if self.repository_name(model, seed):
            cfg["repository_name"] = self.repository_name(model, seed)
        for key in ("display_name", "corpus"):  # corpus: Table 2 compares within a corpus
            if key in spec:
                cfg[key] = spec[key]
        return cfg

    def steps_of(self, model: str) -> int:
        """Training length of ``model``: its own ``steps`` (config models.<m>.steps), else
        training.steps."""
        return int(self.models[model].get("steps", self.config["training"]["steps"]))

    def training_of(self, model: str) -> dict:
        """The training block of ``model``'s run config: training with its own length, and
        intermediate checkpoints only for the timeline models (rule dynamics reads them;
        nothing reads another model's, so they are not written: ~0.5 GB each at paper size)."""
        training = dict(self.config["training"])
        training["steps"] = self.steps_of(model)
        if model not in self.timeline_models:
            training["checkpoint_steps"] = []
        return training

    @cached_property
    def timeline_models(self) -> list[str]:
        """Models with a timeline run (their runs keep training.checkpoint_steps)."""
        return list(dict.fromkeys(m for m, _ in self.run_set("dynamics_timeline")))

    def param_count_runs(self) -> list[dict]:
        """Every run with the model section of its run config (rule param_counts)."""
        return [
            {
                "model": m,
                "seed": s,
                "repository_name": self.repository_name(m, s),
                "display_name": self.models[m].get("display_name", m),
                "geometry": self.models[m]["geometry"],
                "corpus": self.models[m].get("corpus"),
                "model_config": self.model_config(m),
            }
            for m, s in self.runs
        ]

    def basis_family_models(self) -> list[dict]:
        """Every model whose frozen maps come from a Kerdock ⊗ Haar family, with its
        geometry and model config (rule basis_family; docs §5.7)."""
        return [
            {"model": m, "geometry": spec["geometry"], "model_config": self.model_config(m)}
            for m, spec in self.models.items()
            if "basis_members" in self.model_config(m).get("geometry_params", {})
        ]

    def checks_inputs(self) -> list[dict]:
        """Every artifact whose metadata logs checks of docs §18 (rule checks): its kind
        (``headgeom.checks.EXPECTED``), path template name (headgeom.paths.TEMPLATES) and wildcards.
        ``run_log``: an imported model's run log, read for its validation loss only."""
        out = [{"kind": "param_counts", "result": "param_counts"}]
        if self.basis_family_models():
            out.append({"kind": "basis_family", "result": "basis_family"})
        out += [{"kind": "task", "result": "task", "task": t} for t in TASKS]
        for m, s in self.runs:
            run = {"model": m, "seed": s}
            if self.is_imported(m):
                out.append({"kind": "run_log", "result": "train_log", **run})
            else:
                out.append({"kind": "train_log", "result": "train_log", **run})
                out.append({"kind": "manifest", "result": "manifest", **run})
            out.append({"kind": "geometry_summary", "result": "geometry_summary", **run})
            out += [{"kind": "summary", "result": "summary", **run, "task": t} for t in TASKS]
        out += [
            {"kind": "leakage", "result": "leakage", "model": m, "seed": s, "task": t}
            for m, s in self.run_set("leakage")
            for t in TASKS
        ]
        out += [
            {"kind": "clamps", "result": "clamp_pairs", "model": m, "seed": s}
            for m, s in self.run_set("clamps")
        ]
        return out

    def checks_runs(self) -> list[dict]:
        """Every run's model, seed, geometry and corpus (the §7.3 loss-order check)."""
        return [
            {"model": m, "seed": s, "geometry": self.models[m]["geometry"],
             "corpus": self.models[m].get("corpus")}
            for m, s in self.runs
        ]  # fmt: skip

    def intermediate_checkpoints(self, folder: str) -> list[str]:
        """Paths in a run's ``folder`` of every intermediate checkpoint (training.
        checkpoint_steps below the final step) and then of every one's manifest."""
        from headgeom.run_config import TrainConfig, checkpoint_name, checkpoint_schedule  # torch

        steps = checkpoint_schedule(TrainConfig.from_dict(self.config["training"]))
        names = [checkpoint_name(s) for s in steps]
        names += [n.replace(".safetensors", ".manifest.json") for n in names]
        return [f"{folder}/{name}" for name in names]

    def check_exportable(self, model: str) -> None:
        """export_hf: only a ``learned`` checkpoint has a GPT-2 form."""
        geometry = self.models[model]["geometry"]
        if not facts.has_gpt2_form(geometry):
            raise ValueError(
                f"export_hf: model {model!r} has geometry {geometry!r}; only 'learned' "
                "checkpoints can be exported to GPT-2"
            )

    # ------------------------------------------------------------------ corpora
    @cached_property
    def corpora(self) -> dict[str, dict]:
        """name -> the config of that corpus as heads/stages/tokenize_corpus.py takes it. One
        corpus: ``default`` from the top of ``corpus``; several: ``corpus.corpora``."""
        block = self.config["corpus"]
        source = {
            k: v for k, v in block.items() if k not in ("corpora", "default", *_PER_CORPUS_KEYS)
        }
        named = block.get("corpora")
        if named is None:
            if "n_train_tokens" not in block:
                raise ValueError(
                    "config corpus: give n_train_tokens (a study with one corpus) or corpora "
                    "(named corpora, e.g. {R: {n_train_tokens: 200000000}})"
                )
            own = {k: block[k] for k in _PER_CORPUS_KEYS if k in block}
            return {"default": {**source, "name": "default", **own}}
        misplaced = [k for k in _PER_CORPUS_KEYS if k in block]
        if misplaced:
            raise ValueError(
                f"config corpus: {misplaced} set beside corpus.corpora; give them per corpus "
                f"(corpus.corpora.<name>.{misplaced[0]})"
            )
        if block.get("compact_vocab", True) and len(named) > 1:
            raise ValueError(
                f"config corpus: compact_vocab is true but corpus.corpora declares "
                f"{sorted(named)}; each corpus would get its own vocabulary, so set "
                "corpus.compact_vocab: false"
            )
        return {name: {**source, "name": name, **spec} for name, spec in named.items()}

    def corpus_config(self, name: str) -> dict:
        """The config of corpus ``name``: what heads/stages/tokenize_corpus.py takes."""
        return self.corpora[name]

    @property
    def default_corpus(self) -> str:
        return self.config["corpus"].get("default", next(iter(self.corpora)))

    def model_corpus(self, model: str) -> str:
        """The corpus a model trains on (models.<model>.corpus, else the default corpus)."""
        return self.models[model].get("corpus", self.default_corpus)

    @property
    def vocab_corpus(self) -> str | None:
        """The corpus whose compacted vocabulary sets n_vocab; None: GPT-2's (no corpus)."""
        return self.default_corpus if self.config["corpus"].get("compact_vocab", True) else None

    def _check_corpora(self) -> None:
        if self.default_corpus not in self.corpora:
            raise ValueError(
                f"config corpus.default is {self.default_corpus!r}"
                f"{did_you_mean(self.default_corpus, self.corpora)}; declared corpora: "
                f"{sorted(self.corpora)}"
            )
        training, n_ctx = self.config["training"], self.config["architecture"]["n_ctx"]
        for model in self.models:
            needed = self.steps_of(model) * training["batch_size"] * n_ctx + 1  # +1: last target
            name = self.model_corpus(model)
            if name not in self.corpora:
                raise ValueError(
                    f"config models.{model}.corpus is {name!r}{did_you_mean(name, self.corpora)}"
                    f", which the study does not declare (declared: {sorted(self.corpora)}; "
                    "add it under corpus.corpora)"
                )
            spec = self.corpora[name]
            if spec.get("sampling") == "read_once" and spec["n_train_tokens"] < needed:
                raise ValueError(
                    f"config corpus {name} is read once but holds {spec['n_train_tokens']:,} "
                    f"tokens; model {model} consumes {needed:,} "
                    "(steps × batch_size × n_ctx + 1)"
                )

    # ------------------------------------------------------------------ analyses
    def _check_split(self, key: str) -> None:
        """Concentration, lanes and leakage read effects of one split: patching must make it."""
        split, patched = self.config[key]["split"], self.config["patching"]["splits"]
        if split not in patched:
            raise ValueError(
                f"config {key}.split is {split!r} but patching.splits {patched} does not "
                "include it; add it to patching.splits"
            )

    @cached_property
    def pairs(self) -> list[dict]:
        """Model pairs of the paired bootstrap: config concentration.pairs, or the paper's
        pairs present in the study (headgeom.heads.selections.default_pairs)."""
        return selections.resolve_pairs(self.models, self.config["concentration"].get("pairs"))

    @cached_property
    def pair_runs(self) -> list[tuple[str, int]]:
        """Every (model, seed) a pair names, each once, in pair order."""
        keys = ((p[f"model_{side}"], p[f"seed_{side}"]) for p in self.pairs for side in ("a", "b"))
        return list(dict.fromkeys(keys))

    @cached_property
    def loss_models(self) -> list[str]:
        """Models of the loss-versus-N_eff correlation (docs §12.7)."""
        return selections.loss_models(self.models, self.config["concentration"].get("loss_models"))

    def concentration_models(self) -> dict[str, dict]:
        """What the loss-versus-N_eff table says about each model (docs §12.7)."""
        return {
            m: {
                "display_name": spec.get("display_name", m),
                "geometry": spec["geometry"],
                "corpus": spec.get("corpus"),
                "n_head": self.model_config(m)["n_head"],
                "reader_type": facts.reader_kind(spec["geometry"]),
            }
            for m, spec in self.models.items()
        }

    def index_meaningful(self, model: str) -> bool:
        """Head indices form the paper's lanes only with the base head count (docs §10.3)."""
        return self.model_config(model)["n_head"] == self.config["architecture"]["n_head"]

    # ------------------------------------------------------------------ imported models
    # `models.<name>: {import: {format: hf-gpt2, path: DIR}, seeds: [0]}` (or format tl-gpt2, a
    # TransformerLens state dict): a checkpoint the user brings instead of a training recipe.
    # Rule import_model writes its checkpoint, manifest and one-row run log where
    # train/hash_checkpoint write a trained model's; every analysis then reads it unchanged.
    # The seed only names the run.
    def is_imported(self, model: str) -> bool:
        return "import" in self.models[model]

    @property
    def imported_models(self) -> list[str]:
        return [m for m in self.models if self.is_imported(m)]

    @property
    def trained_models(self) -> list[str]:
        return [m for m in self.models if not self.is_imported(m)]

    @property
    def grouped_query_runs(self) -> list[tuple[str, int]]:
        """The runs of imported causal LMs whose query heads share key/value heads
        (``n_kv_head < n_head`` in their model config): rule patch_kv_heads patches them."""

        def grouped(model: str) -> bool:
            cfg = self.model_config(model)  # GPT configs (hf-gpt2 imports) have no n_kv_head
            return "n_kv_head" in cfg and cfg["n_kv_head"] < cfg["n_head"]

        return [(m, s) for m, s in self.runs if self.is_imported(m) and grouped(m)]

    @staticmethod
    def model_pattern(models: Iterable[str]) -> str:
        """A wildcard regex matching exactly ``models`` (none: a regex that matches nothing)."""
        models = list(models)
        return "|".join(map(re.escape, models)) if models else "(?!x)x"

    def import_spec(self, model: str) -> dict:
        return self.models[model]["import"]

    def _imported_model_config(self, model: str) -> dict:
        """The model section of an imported model: from its config.json (read now, so a
        missing or foreign directory fails before any job)."""
        from headgeom.model import importing  # torch: the workflow reads the study

        spec = self.import_spec(model)
        if not facts.has_gpt2_form(self.models[model]["geometry"]):
            raise ValueError(
                f"config models.{model}: an imported model has GPT-2's geometry "
                f"({IMPORTED_GEOMETRY!r}), not {self.models[model]['geometry']!r}"
            )
        try:  # hf-gpt2: config.json; tl-gpt2: config.json if any and the tensor shapes;
            # a causal LM: its config.json or GGUF metadata
            model_cfg = importing.imported_model_config(
                spec["format"], spec.get("path"), spec.get("allow_pickle", False), spec
            )
        except ValueError as err:
            raise ValueError(f"config models.{model}.import: {err}") from None
        n_ctx = self.config["architecture"]["n_ctx"]
        if spec["format"] in importing.CAUSAL_LM_FORMATS:
            from headgeom.model.causal_import import context_length  # torch: as above

            context, key = context_length(model_cfg), "max_position_embeddings"
        else:
            context = model_cfg["n_ctx"]
            key = "n_ctx" if spec["format"] == "tl-gpt2" else "n_positions"
        if context is not None and context < n_ctx:
            raise ValueError(
                f"config models.{model}.import: {key} {context} is below the study's "
                f"architecture.n_ctx {n_ctx}"
            )
        return model_cfg

    def import_inputs(self, model: str) -> list[str]:
        """The files rule import_model reads from the user's directory (or GGUF file)."""
        from headgeom.model import importing  # torch: the workflow reads the study

        spec = self.import_spec(model)
        return importing.import_inputs(
            spec.get("path"), spec.get("allow_pickle", False), spec["format"], spec
        )

    # A study whose models are imported causal LMs (formats hf-causal-lm, gguf) builds its
    # tasks with their own tokenizer: the task files are the study's, shared by every model,
    # so all its models must read one tokenizer (one source), and GPT-2-vocabulary models
    # (trained here, hf-gpt2, tl-gpt2) cannot join them. Such a study trains nothing: its
    # corpus block only supplies the validation text of the import job's loss (stored as
    # GPT-2 ids, which decode to the exact text; the import job re-encodes it).
    @cached_property
    def task_tokenizer(self) -> str | None:
        """The ``--tokenizer`` of heads/stages/make_tasks.py: None (GPT-2's) unless the study's
        models are imported causal LMs, then their model directory or GGUF file."""
        causal = {m: self.import_spec(m) for m in self.imported_models
                  if self.import_spec(m)["format"] in facts.CAUSAL_LM_FORMATS}  # fmt: skip
        if not causal:
            return None
        others = [m for m in self.models if m not in causal]
        first, spec = next(iter(causal.items()))
        if others:
            raise ValueError(
                f"config models: {others} use GPT-2's vocabulary but {first} is an imported "
                f"causal LM (format {spec['format']}) with its own; the task files are shared, "
                "so a study holds causal LMs of one tokenizer only (give each its own study)"
            )
        if spec["format"] == "hub":
            raise ValueError(
                f"config models.{first}.import: format hub cannot supply the tasks' tokenizer "
                "offline; use hf-causal-lm with the model's local directory"
            )
        sources = {m: (s.get("package"), s.get("path")) for m, s in causal.items()}
        if len(set(sources.values())) > 1:
            raise ValueError(
                f"config models: the imported causal LMs name different sources {sources}; "
                "the task files are built with one tokenizer, so a study imports one source"
            )
        from headgeom.model import causal_import  # as importing above: transformers-free

        return str(causal_import.source_of(spec).location)  # the GGUF file or the directory

    def task_tokenizer_files(self) -> list[str]:
        """The files make_tasks reads for :attr:`task_tokenizer` (none for GPT-2's)."""
        if self.task_tokenizer is None:
            return []
        return self.import_inputs(self.imported_models[0])

    def make_tasks_config(self, task: str) -> dict:
        """What heads/stages/make_tasks.py takes as --config-json: the task's config block, plus
        ``tokenizer`` when the study has its own (:attr:`task_tokenizer`). The default
        study's stays the task block, so its jobs and their params are unchanged."""
        if self.task_tokenizer is None:
            return self.task_config(task)
        return {**self.task_config(task), "tokenizer": self.task_tokenizer}

    def import_config(self, model: str, seed: int | str) -> dict:
        """The import run config of (model, seed): what heads/stages/import_model.py takes and the
        manifest records (no training recipe)."""
        cfg = {
            "model_name": model,
            "seed": int(seed),
            "model": self.model_config(model),
            "import": self.import_spec(model),
        }
        if self.repository_name(model, seed):
            cfg["repository_name"] = self.repository_name(model, seed)
        for key in ("display_name", "corpus"):
            if key in self.models[model]:
                cfg[key] = self.models[model][key]
        return cfg

    # ------------------------------------------------------------------ edges (docs §15.1)
    def _check_edge_examples(self) -> None:
        """The edge stage measures the first edges.n_examples of its split: the split must
        hold them (tasks.<task>.splits)."""
        if not self.run_set("edges"):
            return
        cfg = self.config.get("edges", {})
        task, split = cfg.get("task", "sva"), cfg.get("split", "validation")
        n = cfg.get("n_examples", 16)
        sizes = {**lexicon.DEFAULT_SPLIT_SIZES, **self.task_config(task).get("splits", {})}
        if sizes[split] < n:
            raise ValueError(
                f"config edges.n_examples is {n} but tasks.{task}.splits.{split} holds "
                f"{sizes[split]} examples; lower edges.n_examples or enlarge the split"
            )

    # ----------------------------------------------------- dynamics (docs §13.2, §13.4, §14.2–14.5)
    # Training timelines, τ, V-gradient traces (docs §13.2, §13.4, §14.2, §14.4) and the
    # scalar-part ablation (§14.5): which runs, which checkpoints, which layers.
    _given_checkpoint_steps: list[int] | None = None  # training.checkpoint_steps as given

    def _dynamics_checks(self):
        yield self._check_checkpoint_steps
        yield lambda: self.run_set("dynamics_timeline")
        yield lambda: self.run_set("dynamics_ablation")
        yield self._check_value_gradient_steps
        yield self._check_ablation_layers

    def _check_checkpoint_steps(self) -> None:
        """A checkpoint step the config names must lie before the final step (the final
        checkpoint is model.safetensors); the schema's default list is cut silently."""
        given = self._given_checkpoint_steps
        steps = self.config["training"]["steps"]
        trained = [m for m in self.models if not self.is_imported(m)]
        for model in trained:
            own = self.steps_of(model)
            extra = [c for c in self.config["training"]["checkpoint_steps"]
                     if min(own, steps) <= c < max(own, steps)]  # fmt: skip
            if extra:
                # every run writes the same intermediate checkpoints (train's outputs)
                raise ValueError(
                    f"config models.{model}.steps {own}: checkpoint steps {extra} lie between it "
                    f"and training.steps {steps}; every run must write the same checkpoints"
                )
        late = sorted(s for s in (given or []) if s >= steps)
        if late:
            raise ValueError(
                f"config training.checkpoint_steps {late} are not below training.steps "
                f"{steps}; every intermediate checkpoint must come before the final step "
                "(model.safetensors is the final one)"
            )

    @property
    def checkpoint_steps(self) -> list[int]:
        """The intermediate checkpoints training writes (training.checkpoint_steps < steps)."""
        from headgeom.run_config import TrainConfig, checkpoint_schedule  # torch: as above

        return list(checkpoint_schedule(TrainConfig.from_dict(self.config["training"])))

    @property
    def timeline_steps(self) -> list[int]:
        """Intermediate checkpoints of the timelines and τ: every one above step 0 (docs
        §13.2: 256, 1,024, 4,096, 16,384), or config dynamics.timeline_steps; the final step
        is added from the run's own files."""
        chosen = self.stage("dynamics").get("timeline_steps")
        return sorted(chosen) if chosen is not None else [s for s in self.checkpoint_steps if s > 0]

    @property
    def dynamics_checkpoint_steps(self) -> list[int]:
        """Intermediate checkpoints rule dynamics reads: the timeline's and the V-gradients'."""
        wanted = set(self.timeline_steps) | set(self.stage("dynamics")["value_gradient_steps"])
        return sorted(s for s in wanted if s in self.checkpoint_steps)

    @property
    def final_step(self) -> int:
        return int(self.config["training"]["steps"])

    @staticmethod
    def step_label(step: int | str) -> str:
        """The {step} wildcard of a checkpoint step: its zero-padded file-name form."""
        from headgeom.run_config import checkpoint_name  # torch: the workflow reads the study

        return checkpoint_name(int(step)).removeprefix("step").removesuffix(".safetensors")

    def _check_value_gradient_steps(self) -> None:
        for key, steps in (
            ("timeline_steps", self.timeline_steps),
            ("value_gradient_steps", self.stage("dynamics")["value_gradient_steps"]),
        ):
            missing = [s for s in steps if s not in self.checkpoint_steps]
            if missing and self.run_set("dynamics_timeline"):
                raise ValueError(
                    f"config dynamics.{key} {missing} are not intermediate checkpoints "
                    f"(training.checkpoint_steps below steps: {self.checkpoint_steps})"
                )

    def ablation_layers(self, model: str) -> list[int]:
        """Layers of the scalar-part ablation in ``model``: config dynamics.ablation_layers,
        else 1 .. max(1, L // 3) (docs §14.5: layers 1–4 of the paper's 12)."""
        given = self.stage("dynamics").get("ablation_layers")
        if given is not None:
            return sorted(given)
        n_layer = self.model_config(model)["n_layer"]
        return list(range(1, max(1, n_layer // 3) + 1))

    def _check_ablation_layers(self) -> None:
        for model, _ in self.run_set("dynamics_ablation"):
            n_layer = self.model_config(model)["n_layer"]
            late = [layer for layer in self.ablation_layers(model) if layer >= n_layer]
            if late:
                raise ValueError(
                    f"config dynamics.ablation_layers {late} do not exist in model {model!r} "
                    f"({n_layer} layers)"
                )

    def ablation_edits(self) -> list[str]:
        """Names of the edited checkpoints of one ablation run: scalar, random0, random1, ..."""
        return ["scalar"] + [f"random{i}" for i in range(self.stage("dynamics")["ablation_draws"])]

    # ------------------------------------------------------------------ document (docs §17)
    @cached_property
    def patching_summary_runs(self) -> list[tuple[str, int]]:
        """Runs of the paper's 19-configuration summaries (docs §6.7, §12.3): every run of the
        base architecture (the registry leaves out the softmax-free multiscreen controls)."""
        return [
            (m, s) for m, s in self.runs if facts.is_base_architecture(self.models[m]["geometry"])
        ]

    # ----------------------------------------------------------------- ablation (docs §10.1, §10.6)
    # patching.mode picks what a patched head's z becomes (resample | mean | zero); the
    # ablation block opts into two extras beside the paper: the mode comparison
    # (ablation.modes on ablation.mode_models) and the block ablation atlas (ablation.atlas on
    # ablation.atlas_models). Means: one artifact per run.
    @property
    def patch_mode(self) -> str:
        return self.config["patching"]["mode"]

    @property
    def comparison_modes(self) -> list[str]:
        """patching.mode first, then ablation.modes without it."""
        extra = [m for m in self.config["ablation"]["modes"] if m != self.patch_mode]
        return [self.patch_mode, *extra]

    @property
    def extra_modes(self) -> list[str]:
        """The modes patched beside patching.mode for the comparison (own effects files)."""
        return self.comparison_modes[1:]

    @property
    def mode_splits(self) -> list[str]:
        """The splits the mode comparison reads: the concentration split, then the lanes
        split (Λ), in patching.splits order."""
        wanted = {self.config["concentration"]["split"], self.config["lanes"]["split"]}
        return [s for s in self.config["patching"]["splits"] if s in wanted]

    def _check_ablation_windows(self) -> None:
        """The mean and measurement windows must fit in every corpus's validation file (when
        a stage reads them: the atlas, or patching in mean mode)."""
        block, n_ctx = self.config["ablation"], self.config["architecture"]["n_ctx"]
        reads_means = (
            self.run_set("ablation_atlas")
            or self.config["patching"]["mode"] == "mean"
            or ("mean" in block["modes"] and self.run_set("ablation_modes"))
        )
        if not reads_means:
            return
        wanted = block["n_mean_windows"] + block["n_eval_windows"]
        for name, spec in self.corpora.items():
            n_val = spec.get("n_val_tokens")
            if n_val is not None and wanted > n_val // n_ctx:
                raise ValueError(
                    f"config ablation: n_mean_windows + n_eval_windows = {wanted} windows of "
                    f"n_ctx {n_ctx}, but corpus {name} has n_val_tokens {n_val} "
                    f"({n_val // n_ctx} windows); lower them or raise n_val_tokens"
                )
