"""The SA-MoE study a ``kind: samoe`` config describes (docs/samoe.md, SAMOE §19):
:meth:`SAMoEStudy.from_config` checks it against ``workflow/schemas/samoe.schema.yaml`` and
across keys, and answers the SA-MoE workflow's questions: its runs (family, variant, seed),
the stage configs each job hashes, the probe pairs and target layers of a family, and per-rule
resources (:mod:`headgeom.resources`, as for the head-geometry study).

The study kind registered as ``samoe`` (:mod:`headgeom.studies`): its one entry point,
:func:`headgeom.studies.from_config`, hands a ``kind: samoe`` config to this class. A config
it cannot run raises ``StudyConfigError``, one short line per problem.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headgeom.resources import ResourceRequests
from headgeom.studies import KINDS
from headgeom.validation import checked_config, run_checks

if TYPE_CHECKING:  # the workflow reads the study without importing torch (SA-MoE configs do)
    from headgeom.samoe.config import CPTConfig, DenseConfig, MoEConfig

KIND = "samoe"
SCHEMA = KINDS[KIND].schema_path
#: Seconds torchrun waits for its ranks to write the state after a stop signal (a paper
#: run's state, weights and AdamW moments, is ~16 GB).
TORCHRUN_SHUTDOWN_S = 150
#: The CPT keys resolved per run (paper scale: the global batch, per-variant micro-batches).
_PAPER_CPT_KEYS = ("global_batch_seqs", "microbatch")
#: The data keys only the Hub families' corpora read (samoe_hub_corpus).
_HUB_DATA_KEYS = ("sources", "batch_docs", "hub_timeout_s")
#: The data keys only the toy corpus reads (samoe_corpus).
_TOY_DATA_KEYS = ("dense_train_tokens", "val_tokens")


class SAMoEStudy(ResourceRequests):
    """A checked SA-MoE config. Build it with :meth:`from_config`."""

    kind = KIND

    def __init__(self, config: dict):
        self.config = config
        self.name: str = config["study"]
        self.families: dict[str, dict] = config["families"]
        self.variants: list[str] = list(config["variants"])
        self.seeds: list[int] = [int(s) for s in config["seeds"]]

    @classmethod
    def from_config(cls, config: Mapping, schema: str | Path | Mapping = SCHEMA) -> SAMoEStudy:
        study = cls(checked_config(config, schema))
        run_checks(study._checks())
        return study

    # ------------------------------------------------------------------ checks
    def _checks(self):
        yield self.moe_config
        yield self.cpt_config
        yield self._check_batches
        yield self._check_sampling
        yield self._check_pools
        yield self._check_hub_corpus
        yield self._check_downstream
        yield self._check_resources
        for family in self.families:
            if self.is_toy(family):
                yield lambda f=family: self.dense_config(f)
            yield lambda f=family: self._check_layers(f)

    def _check_sampling(self) -> None:
        sampling = self.config["data"]["sampling"]
        if abs(sum(sampling.values()) - 1.0) > 1e-9:
            raise ValueError(
                f"config data.sampling: probabilities sum to {sum(sampling.values()):g}, not 1"
            )

    def _check_pools(self) -> None:
        pools, n = self.config["data"]["pools"], self.config["interventions"]["n_sequences"]
        if n != pools["intervention"]:
            raise ValueError(
                f"config interventions.n_sequences={n} differs from data.pools.intervention="
                f"{pools['intervention']}: the intervention subset is one set of sequences"
            )
        if n > pools["final"]:
            raise ValueError(
                f"config data.pools.intervention={n} exceeds data.pools.final="
                f"{pools['final']}: the subset is cut from the final pool"
            )
        n_ctx = min(self.n_ctx(f) for f in self.families)  # a Hub family without a shape: below
        positions = pools["construction"] * n_ctx
        top = max(self.config["probes"]["budgets"])
        if top > positions:
            raise ValueError(
                f"config probes.budgets: the top budget {top} exceeds the construction pool's "
                f"{positions} positions ({pools['construction']} × {n_ctx})"
            )

    def _check_hub_corpus(self) -> None:
        """Hub families read their documents from data.sources, in whole sequences."""
        if not self.hub_families:
            return
        data = self.config["data"]
        if "sources" not in data:
            raise ValueError(f"config data.sources: missing; the Hub families "
                             f"{self.hub_families} read their corpus from it (a Hub dataset "
                             "or local files per domain: prose, code, math)")  # fmt: skip
        for domain, spec in data["sources"].items():
            hub_keys = sorted(set(spec) & {"config", "data_dir", "split", "revision"})
            if "files" in spec and hub_keys:
                raise ValueError(f"config data.sources.{domain}: local files take no Hub keys "
                                 f"{hub_keys}")  # fmt: skip
        for family in self.hub_families:
            n, T = data["cpt_train_tokens"], self.n_ctx(family)
            if n % T:
                raise ValueError(f"config data.cpt_train_tokens: {n} is not a multiple of "
                                 f"{T}, the sequence length of family {family} (the stream "
                                 "is whole packed sequences)")  # fmt: skip

    def _check_downstream(self) -> None:
        """Toy families score the toy suite; Hub families run the harness's tasks at a pinned
        commit and max_len (SAMOE §11). (A study of both kinds has one task list for both:
        each job refuses the other kind's tasks.)"""
        from headgeom.samoe.downstream import TOY_TASKS  # torch: workflow reads this

        ds = self.config["downstream"]
        toy = [t for t in ds["tasks"] if t in TOY_TASKS]
        if self.toy_families and self.hub_families:
            return
        if self.toy_families and len(toy) < len(ds["tasks"]):
            raise ValueError(f"config downstream.tasks: {sorted(set(ds['tasks']) - set(toy))} "
                             f"are lm-eval tasks; the toy families {self.toy_families} score "
                             f"the toy suite ({', '.join(TOY_TASKS)})")  # fmt: skip
        if self.hub_families:
            if toy:
                raise ValueError(f"config downstream.tasks: {toy} are toy tasks; the Hub "
                                 f"families {self.hub_families} run lm-eval tasks (hellaswag, "
                                 "arc_easy, piqa, winogrande)")  # fmt: skip
            missing = [k for k in ("harness_commit", "max_len") if k not in ds]
            if missing and self.harness_families:
                raise ValueError(f"config downstream: {missing} missing; the Hub families "
                                 f"{self.hub_families} run lm-evaluation-harness at a pinned "
                                 "commit with a maximum length (SAMOE §11)")  # fmt: skip

    def _check_layers(self, family: str) -> None:
        n = self.n_layer(family)
        where = f"config families.{family}"
        for src, tgt in self.probe_pairs(family):
            if not 0 <= src < tgt < n:
                raise ValueError(f"{where}: probe pair [{src}, {tgt}] needs 0 ≤ source < target < "
                                 f"{n} (the family's MoE layers)")  # fmt: skip
        missing = [p for p in self.long_horizon_pairs(family) if p not in self.probe_pairs(family)]
        if missing:
            raise ValueError(f"config probes.long_horizon (or families.{family}.long_horizon): "
                             f"{missing} are not probe pairs of family {family}")  # fmt: skip
        for layer in self.target_layers(family):
            if not 1 <= layer < n:
                raise ValueError(f"{where}: target layer {layer} needs 1 ≤ layer < {n}")
        for h in self.config["interventions"]["persistence_horizons"]:
            if h > min(self.target_layers(family)):
                raise ValueError(
                    f"config interventions.persistence_horizons: {h} layers back from target "
                    f"layer {min(self.target_layers(family))} of family {family} is before layer 0"
                )

    # ------------------------------------------------------------------ families
    def is_toy(self, family: str) -> bool:
        return "dense" in self.families[family]

    def is_source(self, family: str) -> bool:
        """A family whose dense model is a local model source (GGUF file or directory)."""
        return "source" in self.families[family]

    @cached_property
    def toy_families(self) -> list[str]:
        return [f for f in self.families if self.is_toy(f)]

    @cached_property
    def hub_families(self) -> list[str]:
        """The imported families (a pinned Hub model or a local model source): their own
        tokenizer's corpus (samoe_hub_corpus) and the Hub wrap."""
        return [f for f in self.families if not self.is_toy(f)]

    @cached_property
    def harness_families(self) -> list[str]:
        """The imported families whose downstream suite runs (samoe_harness): all of them
        unless ``downstream.run_harness`` is false (offline)."""
        run = self.config["downstream"].get("run_harness", True)
        return self.hub_families if run else []

    def import_config(self, family: str) -> dict:
        """What rule samoe_import_dense hashes: the pinned Hub source of a family, or its
        local model source with the paper shape it must have."""
        if self.is_source(family):
            fam = self.families[family]
            return {"family": family, "source": dict(fam["source"]),
                    "paper_shape": fam["paper_shape"]}  # fmt: skip
        return {"family": family, "hf": self.hf(family)}

    def source_files(self, family: str) -> list[str]:
        """The local files a source family's import and corpus read (the workflow tracks
        them); none for a Hub or toy family."""
        if not self.is_source(family):
            return []
        from headgeom.model.causal_import import import_files  # torch: the workflow reads this

        return import_files(self.families[family]["source"])

    def dense_config(self, family: str) -> DenseConfig:
        from headgeom.samoe.config import DenseConfig  # torch: the workflow reads the study

        if not self.is_toy(family):
            raise ValueError(f"family {family} is imported ({self.import_config(family)}), "
                             "not trained")  # fmt: skip
        try:
            return DenseConfig.from_dict(self.families[family]["dense"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"config families.{family}.dense: {err}") from None

    def hf(self, family: str) -> dict:
        return self.families[family]["hf"]

    def n_layer(self, family: str) -> int:
        if self.is_toy(family):
            return self.dense_config(family).n_layer
        return self.paper_shape(family).n_layer

    def paper_shape(self, family: str):
        """The shapes of a Hub or source family (``headgeom.samoe.counts.PAPER_SHAPES``: the
        paper's dense model it is, or has the shapes of), at its sequence length
        (``seq_len``, default the paper's T)."""
        from headgeom.samoe.counts import PAPER_SHAPES  # torch: the workflow reads the study

        fam = self.families[family]
        key, repo = (("paper_shape", fam["paper_shape"]) if self.is_source(family)
                     else ("hf.repo_id", self.hf(family)["repo_id"]))  # fmt: skip
        if repo not in PAPER_SHAPES:
            raise ValueError(f"config families.{family}.{key}: {repo!r} has no known "
                             f"shape; known: {sorted(PAPER_SHAPES)}")  # fmt: skip
        shape = PAPER_SHAPES[repo]
        if "seq_len" in fam:
            shape = dataclasses.replace(shape, seq_len=int(fam["seq_len"]))
        return shape

    def n_ctx(self, family: str) -> int:
        if self.is_toy(family):
            return self.dense_config(family).n_ctx
        return self.paper_shape(family).seq_len

    def probe_pairs(self, family: str) -> list[tuple[int, int]]:
        pairs = self.families[family].get("probe_pairs", self.config["probes"]["pairs"])
        return [(int(a), int(b)) for a, b in pairs]

    def long_horizon_pairs(self, family: str) -> list[tuple[int, int]]:
        pairs = self.families[family].get("long_horizon", self.config["probes"]["long_horizon"])
        return [(int(a), int(b)) for a, b in pairs]

    def target_layers(self, family: str) -> list[int]:
        layers = self.families[family].get(
            "target_layers", self.config["interventions"]["target_layers"]
        )
        return [int(x) for x in layers]

    # ------------------------------------------------------------------ stage configs
    def moe_config(self) -> MoEConfig:
        from headgeom.samoe.config import MoEConfig  # torch: the workflow reads the study

        try:
            return MoEConfig.from_dict(self.config["moe"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"config moe: {err}") from None

    def cpt_config(self, variant: str | None = None) -> CPTConfig:
        """The recipe; for ``variant``, with its micro-batch from ``cpt.microbatch``."""
        from headgeom.samoe.config import CPTConfig  # torch: the workflow reads the study

        cpt = {k: v for k, v in self.config["cpt"].items() if k not in _PAPER_CPT_KEYS}
        micro = self.config["cpt"].get("microbatch", {})
        if variant in micro:
            cpt["micro_batch"] = micro[variant][0]
        try:
            return CPTConfig.from_dict(cpt)
        except (TypeError, ValueError) as err:
            raise ValueError(f"config cpt: {err}") from None

    @property
    def train_ranks(self) -> int:
        """Processes of one samoe_train job: one per GPU it asks for (torchrun), else one."""
        return max(1, int(self._resource("samoe_train", "gpu", 0)))

    @property
    def train_launcher(self) -> str:
        """How rule samoe_train starts its script: one process, or one per GPU."""
        n = self.train_ranks
        if n == 1:
            return "python"
        # Slurm's TERM (or USR1) reaches every rank, which stop at one update and rank 0
        # writes the state; SIGKILL only after TORCHRUN_SHUTDOWN_S
        return (f"torchrun --standalone --nproc_per_node={n} --signals-to-handle "
                f"SIGTERM,SIGINT,SIGUSR1 --shutdown-timeout {TORCHRUN_SHUTDOWN_S}")  # fmt: skip

    def _check_batches(self) -> None:
        """The global batch is ranks × micro-batch × accumulation, as the config states."""
        cpt, ranks = self.config["cpt"], self.train_ranks
        if cpt.get("global_batch_seqs", cpt.get("batch_size")) != cpt.get("batch_size"):
            raise ValueError(f"config cpt: global_batch_seqs {cpt['global_batch_seqs']} differs "
                             f"from batch_size {cpt.get('batch_size')} (sequences per "
                             "update)")  # fmt: skip
        for variant, (micro, accumulation) in cpt.get("microbatch", {}).items():
            where = f"config cpt.microbatch.{variant} [{micro}, {accumulation}]"
            if variant not in self.variants:
                raise ValueError(f"{where}: {variant!r} is not a variant of this study")
            try:
                got = self.cpt_config(variant).accumulation(ranks)
            except ValueError as err:
                raise ValueError(f"{where} with {ranks} rank(s) (resources.samoe_train.gpu): "
                                 f"{err}") from None  # fmt: skip
            if got != accumulation:
                raise ValueError(f"{where}: {ranks} rank(s) × {micro} × {accumulation} is not "
                                 f"batch_size {cpt['batch_size']}; resources.samoe_train.gpu "
                                 f"sets the ranks")  # fmt: skip

    def stage(self, name: str) -> dict:
        return self.config[name]

    def corpus_config(self) -> dict:
        """What rule samoe_corpus hashes: the data block (less the Hub corpora's keys), the
        toy families' context lengths (pool sequence length) and the downstream suite."""
        data = {k: v for k, v in self.config["data"].items() if k not in _HUB_DATA_KEYS}
        return {
            "data": data,
            "seq_len": min(self.n_ctx(f) for f in self.toy_families or self.families),
            "downstream": self.config["downstream"],
        }

    def hub_corpus_config(self, family: str) -> dict:
        """What rule samoe_hub_corpus hashes for a Hub family: its tokenizer (the dense
        import's repository and revision), its sequence length and the data block (less the
        toy corpus's keys)."""
        if self.is_toy(family):
            raise ValueError(f"family {family} reads the study's toy corpus (samoe_corpus)")
        data = {k: v for k, v in self.config["data"].items() if k not in _TOY_DATA_KEYS}
        fam = self.families[family]
        if self.is_source(family):  # the tokenizer of the local model source
            eos = {"eos_token": fam["eos_token"]} if "eos_token" in fam else {}
            tokenizer = {"source": dict(fam["source"]), **eos}
        else:
            tokenizer = dict(self.hf(family))
        return {"family": family, "tokenizer": tokenizer,
                "seq_len": self.n_ctx(family), "data": data}  # fmt: skip

    def dense_run_config(self, family: str) -> dict:
        return {"family": family, "dense": self.dense_config(family).to_dict(),
                "data_seed": self.config["data"]["seed"]}  # fmt: skip

    def run_config(self, family: str, variant: str, seed: int | str) -> dict:
        """What upcycling and continued pretraining of one run hash."""
        return {
            "family": family,
            "variant": variant,
            "seed": int(seed),
            "data_seed": self.config["data"]["seed"],
            "moe": self.moe_config().to_dict(),
            "cpt": self.cpt_config(variant).to_dict(),
            # a Hub model's context exceeds the study's sequences; the toy's is them
            **({} if self.is_toy(family) else {"seq_len": self.n_ctx(family)}),
        }

    @property
    def analysis_device(self) -> str:
        """The analyses' ``--device`` (config ``analysis_device``: auto, cpu, cuda[:N])."""
        return self.config["analysis_device"]

    @property
    def batch_flag(self) -> str:
        """The analyses' ``--batch-sequences N`` (config ``capture.batch_sequences``), or ""
        when not set (a whole pool in one capture forward)."""
        n = self.config.get("capture", {}).get("batch_sequences")
        return "" if n is None else f"--batch-sequences {int(n)}"

    def analysis_config(self, family: str) -> dict:
        """What every per-run analysis of ``family`` hashes."""
        return {
            "family": family,
            "n_layer": self.n_layer(family),
            "local_suppression": self.config["local_suppression"],
            "probes": {
                **self.config["probes"],
                "pairs": self.probe_pairs(family),
                "long_horizon": self.long_horizon_pairs(family),
            },  # fmt: skip
            "interventions": {
                **self.config["interventions"],
                "target_layers": self.target_layers(family),
            },  # fmt: skip
            "downstream": self.config["downstream"],
            "noninferiority": self.config["noninferiority"],
        }

    # ------------------------------------------------------------------ runs
    @cached_property
    def runs(self) -> list[tuple[str, str, int]]:
        """(family, variant, seed) of every run, family by family, seed by seed."""
        return [(f, v, s) for f in self.families for s in self.seeds for v in self.variants]

    @cached_property
    def state_runs(self) -> list[tuple[str, str, int]]:
        return [r for r in self.runs if r[1] != "ordinary"]  # latest, persistent

    @cached_property
    def ordinary_runs(self) -> list[tuple[str, str, int]]:
        return [r for r in self.runs if r[1] == "ordinary"]

    def pattern(self, values) -> str:
        return "|".join(re.escape(str(v)) for v in values) or "(?!)"

    def summary(self) -> dict[str, Any]:
        return {"families": list(self.families), "variants": self.variants, "seeds": self.seeds,
                "runs": len(self.runs)}  # fmt: skip
