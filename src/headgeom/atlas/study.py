"""The edit atlas a ``kind: atlas`` config describes (docs/atlas.md):
:meth:`AtlasStudy.from_config` checks it against ``workflow/schemas/atlas.schema.yaml`` and
across keys, and answers the atlas workflow's questions: the model source, what each stage
hashes, the sweep's shards, and per-rule resources (:mod:`headgeom.resources`).

The study kind registered as ``atlas`` (:mod:`headgeom.studies`). Torch stays out of this
module: the workflow reads it at parse time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from headgeom.resources import ResourceRequests
from headgeom.studies import KINDS
from headgeom.validation import checked_config, run_checks

KIND = "atlas"
SCHEMA = KINDS[KIND].schema_path
#: Source keys by model format (headgeom.model.causal_import.source_of takes the same).
_FORMAT_KEYS = {
    "hf-causal-lm": ({"path"}, {"path", "package", "allow_pickle"}),
    "gguf": ({"path"}, {"path", "package", "allow_pickle"}),
    "hub": ({"repo_id", "revision"}, {"repo_id", "revision", "allow_pickle"}),
}


class AtlasStudy(ResourceRequests):
    """A checked edit-atlas config. Build it with :meth:`from_config`."""

    kind = KIND

    def __init__(self, config: dict):
        self.config = config
        self.name: str = config["study"]

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

    def _check_model(self) -> None:
        model = self.config["model"]
        needs, takes = _FORMAT_KEYS[model["format"]]
        missing = sorted(needs - set(model))
        stray = sorted(set(model) - takes - {"format"})
        if missing or stray:
            raise ValueError(
                f"config model: format {model['format']} needs {', '.join(sorted(needs))} and "
                f"takes {', '.join(sorted(takes))}; missing {missing or 'none'}, not taken "
                f"{stray or 'none'}"
            )

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
        """The model's name on the atlas page: its file or folder name (no ``.gguf``), or
        its Hub repository."""
        spec = self.config["model"]
        name = spec.get("repo_id") or Path(spec["path"]).name
        return name.removesuffix(".gguf")

    def page_optional(self) -> list[str]:
        """The optional tables the atlas page shows that this study makes: the compression
        table where the compression view is enabled (config ``compression.enabled``)."""
        return ["compression"] if self.compression_enabled else []

    def model_files(self) -> list[str]:
        """The local files the model source reads (a GGUF file; a directory's config, weights
        and tokenizer files): inputs of every job that reads the model; none for the Hub."""
        from headgeom.model import causal_import  # torch: the workflow reads the study

        return causal_import.import_files(self.model_spec)

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
