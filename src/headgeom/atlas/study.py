"""The edit atlas a ``kind: atlas`` config describes (docs/atlas.md):
:meth:`AtlasStudy.from_config` checks it against ``workflow/schemas/atlas.schema.yaml`` and
across keys, and answers the atlas workflow's questions: the model source, what each stage
hashes, the sweep's shards, the pairs of checkpoints (config ``pairs``), and per-rule resources
(:mod:`headgeom.resources`).

The study kind registered as ``atlas`` (:mod:`headgeom.studies`). Torch stays out of this
module: the workflow reads it at parse time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from headgeom.atlas.paths import checkpoint_files
from headgeom.resources import ResourceRequests
from headgeom.studies import KINDS
from headgeom.validation import checked_config, run_checks

KIND = "atlas"
SCHEMA = KINDS[KIND].schema_path
#: Source keys by model format (headgeom.model.causal_import.source_of takes the first three;
#: checkpoint: one of our own, headgeom.atlas.model_source).
_FORMAT_KEYS = {
    "hf-causal-lm": ({"path"}, {"path", "package", "allow_pickle"}),
    "gguf": ({"path"}, {"path", "package", "allow_pickle"}),
    "hub": ({"repo_id", "revision"}, {"repo_id", "revision", "allow_pickle"}),
    "checkpoint": ({"path"}, {"path", "allow_pickle"}),
}
CHECKPOINT = "checkpoint"


class AtlasStudy(ResourceRequests):
    """A checked edit-atlas config. Build it with :meth:`from_config`."""

    kind = KIND

    def __init__(self, config: dict):
        self.config = config
        self.name: str = config["study"]
        #: Where the workflow writes the study's files (its PATHS prefix).
        self.results_dir: str = f"results/{self.name}"

    @classmethod
    def from_config(cls, config: Mapping, schema: str | Path | Mapping = SCHEMA) -> AtlasStudy:
        study = cls(checked_config(config, schema))
        run_checks(study._checks())
        return study

    # ------------------------------------------------------------------ checks
    def _checks(self):
        yield self._check_model
        yield self._check_corpora
        yield self._check_resources
        yield self._check_compression
        yield self._check_pairs

    def _check_model(self) -> None:
        _check_source(self.config["model"], "config model")

    def _check_corpora(self) -> None:
        names = [c["name"] for c in self.config["corpora"]]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"config corpora: names {dupes} occur more than once")
        for i, c in enumerate(self.config["corpora"]):
            where = f"config corpora[{i}] ({c['name']})"
            if c["source"] == "file" and "path" not in c:
                raise ValueError(f"{where}: a file corpus needs a path")
            if c["source"] == "domain" and "domain" not in c:
                raise ValueError(f"{where}: a domain corpus needs a domain (prose, code, math)")
            takes = {"file": {"path"}, "domain": {"domain"}}.get(c["source"], set())
            extra = sorted(set(c) - {"name", "source", "seed"} - takes)
            if extra:
                raise ValueError(f"{where}: source {c['source']} takes no {extra}")

    # ------------------------------------------------------------------ stage configs
    @property
    def model_spec(self) -> dict:
        """The model's import block (``headgeom.model.causal_import.source_of``)."""
        return dict(self.config["model"])

    @property
    def model_name(self) -> str:
        """The model's name on the atlas page: its file or folder name (no ``.gguf``), its
        Hub repository, or one of our checkpoints' path below ``models/``."""
        from headgeom.atlas import model_source  # torch: the workflow reads the study

        return model_source.model_name(self.config["model"])

    def page_optional(self) -> list[str]:
        """The optional tables the atlas page shows that this study makes: the compression
        table where the compression view is enabled (config ``compression.enabled``)."""
        return ["compression"] if self.compression_enabled else []

    def model_files(self) -> list[str]:
        """The local files the model source reads (a GGUF file; a directory's config, weights
        and tokenizer files; a checkpoint and its manifest): inputs of every job that reads
        the model; none for the Hub."""
        return _source_files(self.model_spec)

    def inputs_config(self) -> dict:
        """What rule atlas_inputs hashes: the model (its tokenizer), corpora, windows, skills."""
        c = self.config
        return {"model": self.model_spec, "corpora": c["corpora"], "windows": c["windows"],
                "skills": c["skills"]}  # fmt: skip

    def profile_config(self) -> dict:
        """What rule atlas_profile hashes: the model, and how its forwards run."""
        run = self.config["sweep"]
        return {"model": self.model_spec,
                "sweep": {k: run[k] for k in ("batch_size", "device")}}  # fmt: skip

    def sweep_config(self) -> dict:
        """What every shard of rule atlas_sweep hashes."""
        c = self.config
        return {"model": self.model_spec, "edits": c["edits"], "sweep": c["sweep"]}

    @property
    def shards(self) -> list[int]:
        return list(range(int(self.config["sweep"]["shards"])))

    @property
    def device(self) -> str:
        return self.config["sweep"]["device"]

    def pattern(self, values) -> str:
        return "|".join(re.escape(str(v)) for v in values) or "(?!)"

    def summary(self) -> dict:
        return {"model": self.model_spec, "corpora": [c["name"] for c in self.config["corpora"]],
                "shards": len(self.shards)}  # fmt: skip

    # ------------------------------------------------------------------ compression view
    def _check_compression(self) -> None:
        c = self.config.get("compression", {})
        names = [x["name"] for x in self.config["corpora"]]
        prune, mixed = c.get("prune", {}), c.get("mixed", {})
        if prune.get("ns"):
            counting = prune.get("counting_corpus")
            if counting not in names:
                raise ValueError(
                    f"config compression.prune.counting_corpus: {counting!r} is not a corpus "
                    f"of corpora ({', '.join(names)}); vocabulary pruning counts one of them"
                )
        if mixed.get("n_sensitive"):
            chosen = mixed.get("sensitivity_corpus")
            if chosen not in names:
                raise ValueError(
                    f"config compression.mixed.sensitivity_corpus: {chosen!r} is not a corpus "
                    f"of corpora ({', '.join(names)})"
                )
            if names == [chosen]:
                raise ValueError(
                    f"config compression.mixed.sensitivity_corpus: {chosen!r} is the only "
                    "scoring corpus, so the mixed-precision rows would be scored on the corpus "
                    "their sensitive layers were chosen on; add another corpus"
                )
            if mixed.get("high_bits", 8) <= mixed.get("bits", 4):
                raise ValueError(
                    f"config compression.mixed: high_bits {mixed.get('high_bits', 8)} must "
                    f"exceed bits {mixed.get('bits', 4)}"
                )

    @property
    def compression_enabled(self) -> bool:
        return bool(self.config.get("compression", {}).get("enabled", True))

    def compression_config(self) -> dict:
        """What rule atlas_compression hashes: the model, the corpora (pruning counts one),
        the compression block, and how the forwards run."""
        c, run = self.config, self.config["sweep"]
        how = ("batch_size", "kl_chunk", "probe_rows", "device")
        return {
            "model": self.model_spec,
            "corpora": c["corpora"],
            "compression": c.get("compression", {}),
            "sweep": {k: run[k] for k in how},
        }

    # ------------------------------------------------------------------ the model's reach
    def model_note(self) -> str | None:
        """A line for the planner when the model cannot be read here: a Hub source whose
        snapshot is not in the local Hub cache needs network for its weights (offline, rule
        atlas_inputs stops reading it); None when the model is local or cached."""
        model = self.config["model"]
        if model["format"] != "hub":
            return None
        repo, revision = model["repo_id"], model["revision"]
        from huggingface_hub import try_to_load_from_cache  # optional ([hf]); Hub configs only

        if isinstance(try_to_load_from_cache(repo, "config.json", revision=revision), str):
            return None
        pin = " (the placeholder revision 000…: pin the commit you use)" if not int(
            revision, 16) else ""  # fmt: skip
        return (
            f"model {repo}@{revision}{pin} is a Hub source that is not in the local Hub "
            "cache: its weights need network access to the Hugging Face Hub. Offline, the "
            "workflow plans but rule atlas_inputs stops when it reads the model."
        )

    # ------------------------------------------------------------------ two checkpoints
    def _check_pairs(self) -> None:
        pairs = self.config.get("pairs", [])
        names = [p["name"] for p in pairs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"config pairs: names {dupes} occur more than once")
        tasks = self.config["skills"]["tasks"]
        for i, pair in enumerate(pairs):
            where = f"config pairs[{i}] ({pair['name']})"
            _check_source(pair["a"], f"{where}.a")
            if ("b" in pair) == ("fine_tune" in pair):
                raise ValueError(
                    f"{where}: give checkpoint B as b (a model source) or have it made here "
                    "from A with fine_tune, exactly one of them"
                )
            if "b" in pair:
                _check_source(pair["b"], f"{where}.b")
            else:
                if pair["a"]["format"] != CHECKPOINT:
                    raise ValueError(
                        f"{where}.fine_tune: fine-tunes one of our own checkpoints; a.format is "
                        f"{pair['a']['format']}, not checkpoint"
                    )
                if pair["fine_tune"]["task"] not in tasks:
                    raise ValueError(
                        f"{where}.fine_tune.task: {pair['fine_tune']['task']!r} is not among "
                        f"skills.tasks ({', '.join(tasks)}), so no probe would see it"
                    )
            alphas = pair["alphas"]
            if not {0, 1} <= set(alphas):
                raise ValueError(f"{where}.alphas: must include 0 (A) and 1 (B); got {alphas}")

    @property
    def pairs(self) -> list[str]:
        """The pairs' names, in config order."""
        return [p["name"] for p in self.config.get("pairs", [])]

    def _pair(self, name: str) -> dict:
        for pair in self.config.get("pairs", []):
            if pair["name"] == name:
                return pair
        raise KeyError(f"no pair {name!r} in config pairs ({', '.join(self.pairs) or 'none'})")

    def fine_tuned(self, name: str) -> bool:
        """Whether the pair's B is made here from A (config ``pairs[].fine_tune``)."""
        return "fine_tune" in self._pair(name)

    @property
    def fine_tuned_pairs(self) -> list[str]:
        return [n for n in self.pairs if self.fine_tuned(n)]

    def pair_source(self, name: str, which: str) -> dict:
        """Checkpoint ``which`` ("a" or "b") of a pair as a model source; a fine-tuned B is the
        run folder rule atlas_pair_fine_tune writes (headgeom.atlas.paths ``pair_tuned``)."""
        pair = self._pair(name)
        if which == "b" and self.fine_tuned(name):
            return {"format": CHECKPOINT, "path": f"{self.results_dir}/atlas/pairs/{name}/tuned"}
        return dict(pair[which])

    def pair_files(self, name: str, which: str) -> list[str]:
        """The local files checkpoint ``which`` of a pair reads (inputs of its jobs)."""
        return _source_files(self.pair_source(name, which))

    def pair_shares_inputs(self, name: str) -> bool:
        """Whether a pair's A is the study's model, so its windows and probe items are the
        study's own (rule atlas_inputs); otherwise rule atlas_pair_inputs cuts them."""
        return self.pair_source(name, "a") == self.model_spec

    def pair_inputs_config(self, name: str) -> dict:
        """What rule atlas_pair_inputs hashes: rule atlas_inputs' config with A as the model
        (the pair's windows and probes are cut with A's tokenizer)."""
        return {**self.inputs_config(), "model": self.pair_source(name, "a")}

    def pair_fine_tune_config(self, name: str) -> dict:
        """What rule atlas_pair_fine_tune hashes: A, the fine-tune, and the task's seed (the
        probes' skill seed, so its training items come from the same lexicon partition as the
        probes' evaluation items, from another split)."""
        pair, skills = self._pair(name), self.config["skills"]
        task = pair["fine_tune"]["task"]
        seed = int(skills["seed"]) + skills["tasks"].index(task)
        return {"a": self.pair_source(name, "a"), "fine_tune": pair["fine_tune"],
                "task_seed": seed}  # fmt: skip

    def pair_config(self, name: str) -> dict:
        """What every view of a pair hashes: A, B, the views' settings, how forwards run."""
        pair, run = self._pair(name), self.config["sweep"]
        how = ("batch_size", "kl_chunk", "probe_rows", "device")
        return {
            "name": name,
            "a": self.pair_source(name, "a"),
            "b": self.pair_source(name, "b"),
            **{k: pair[k] for k in ("alphas", "grafts", "lowrank")},
            "sweep": {k: run[k] for k in how},
        }

    def pair_drift_config(self, name: str) -> dict:
        """What rule atlas_pair_drift hashes: A and B (no forward runs)."""
        return {"name": name, "a": self.pair_source(name, "a"), "b": self.pair_source(name, "b")}

    def missing_checkpoints(self) -> list[str]:
        """The files of the checkpoint sources (model and pairs; not B made here) that do not
        exist: the head-geometry study's results this study reads."""
        specs = [self.model_spec] + [self.pair_source(n, w) for n in self.pairs for w in "ab"]
        files = [f for s in specs if s["format"] == CHECKPOINT for f in _source_files(s)]
        tuned = {f for n in self.fine_tuned_pairs for f in self.pair_files(n, "b")}
        return [f for f in dict.fromkeys(files) if f not in tuned and not Path(f).exists()]

    def missing_note(self) -> str | None:
        """A line for the planner when checkpoints are missing (None otherwise)."""
        missing = self.missing_checkpoints()
        if not missing:
            return None
        demo = any(Path(f).parts[:2] == ("results", "demo") for f in missing)
        how = ("run the default demo first: snakemake --cores all" if demo else
               "train or copy those checkpoints first")  # fmt: skip
        shown = ", ".join(missing[:3]) + (", …" if len(missing) > 3 else "")
        return f"{len(missing)} checkpoint file(s) this study reads do not exist ({shown}): {how}"


def _check_source(spec: Mapping, where: str) -> None:
    """A model source's keys for its format (schema: workflow/schemas/atlas.schema.yaml)."""
    needs, takes = _FORMAT_KEYS[spec["format"]]
    missing = sorted(needs - set(spec))
    stray = sorted(set(spec) - takes - {"format"})
    if missing or stray:
        raise ValueError(
            f"{where}: format {spec['format']} needs {', '.join(sorted(needs))} and "
            f"takes {', '.join(sorted(takes))}; missing {missing or 'none'}, not taken "
            f"{stray or 'none'}"
        )
    if spec["format"] == CHECKPOINT:
        try:
            checkpoint_files(spec["path"])
        except ValueError as err:
            raise ValueError(f"{where}.path: {err}") from None


def _source_files(spec: Mapping) -> list[str]:
    """The local files a model source reads (without reading any for a checkpoint)."""
    if spec["format"] == CHECKPOINT:
        return [str(p) for p in checkpoint_files(spec["path"])]
    from headgeom.model import causal_import  # torch: the workflow reads the study

    return causal_import.import_files(dict(spec))
