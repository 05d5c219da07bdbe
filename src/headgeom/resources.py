"""What each job asks the machine for: memory, run time, CPUs, GPUs and the Slurm keys, from
config ``resources`` (per rule, ``gpu_default`` for every GPU rule, ``default``) over each
rule's own defaults. One config places the DAG on a laptop and on Slurm (slurm/config.yaml).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from headgeom.validation import StudyConfigError, did_you_mean, listing

#: Config ``resources`` scope applied to every rule that asks for a GPU (before ``default``).
GPU_SCOPE = "gpu_default"
#: Passed to the Slurm executor plugin as they are (sbatch -p, -A, --gpus=<model>:<n>, -C, ...).
SLURM_KEYS = ("slurm_partition", "slurm_account", "slurm_extra", "gpu_model", "constraint", "qos")


class ResourceRequests:
    """The resource answers of a study object (:mod:`headgeom.studies`; ``self.config`` is the
    study's)."""

    config: dict

    # One config places the DAG on a laptop and on Slurm (slurm/config.yaml). Cluster
    # requests come from config values, never from `threads`: `--cores all` caps threads to
    # the submit host's cores (snakemake #2447), and the Slurm plugin would otherwise derive
    # --cpus-per-task from the capped value.
    def _scopes(self, rule: str) -> tuple[str, ...]:
        """Where a rule's resources are looked up, nearest first: ``resources.<rule>``, for a
        GPU job ``resources.gpu_default`` (the GPU partition, gpu_model, constraint, CPUs per
        GPU: set once for every GPU rule), then ``resources.default``."""
        table = self.config["resources"]
        gpu = next((table[s]["gpu"] for s in (rule, "default") if "gpu" in table.get(s, {})), 0)
        return (rule, GPU_SCOPE, "default") if gpu else (rule, "default")

    def _resource(self, rule: str, key: str, fallback: Any) -> Any:
        """``key`` from the rule's nearest scope that names it (:meth:`_scopes`), else
        ``fallback``."""
        table = self.config["resources"]
        for scope in self._scopes(rule):
            if key in table.get(scope, {}):
                return table[scope][key]
        return fallback

    def _cpu_request(self, rule: str) -> tuple[str, int] | None:
        """(key, value) of the CPU request from the nearest scope that names one:
        cpus_per_task, or cpus_per_gpu for a GPU job; None when no scope does."""
        gpu = self._resource(rule, "gpu", 0)
        for scope in self._scopes(rule):
            entry = self.config["resources"].get(scope, {})
            if "cpus_per_task" in entry:
                return "cpus_per_task", entry["cpus_per_task"]
            if gpu and "cpus_per_gpu" in entry:
                return "cpus_per_gpu", entry["cpus_per_gpu"]
        return None

    def threads(self, rule: str) -> int:
        """Threads of a rule's job: ``resources.<rule>.threads`` capped by the CPUs the job
        asks for; without ``threads``, those CPUs; without either, 1."""
        request = self._cpu_request(rule)
        wanted = self._resource(rule, "threads", None)
        if request is None:
            return 1 if wanted is None else wanted
        key, value = request
        cpus = value * self._resource(rule, "gpu", 0) if key == "cpus_per_gpu" else value
        return cpus if wanted is None else min(wanted, cpus)

    def resources(self, rule: str, mem_mb: int, runtime: int) -> dict[str, Any]:
        """A rule's resources: memory (MB) and run time (minutes) from config, else the rule's
        own defaults; ``gpu`` (sbatch --gpus; locally the workflow's ``gpu`` pool); the CPU
        request pinned from config (cpus_per_task, or cpus_per_gpu for GPU jobs; by default the
        rule's threads) and the Slurm plugin keys of :data:`SLURM_KEYS` that config sets."""
        out = {
            "mem_mb": self._resource(rule, "mem_mb", mem_mb),
            "runtime": self._resource(rule, "runtime", runtime),
            "gpu": self._resource(rule, "gpu", 0),
        }
        key, value = self._cpu_request(rule) or ("cpus_per_task", self.threads(rule))
        out[key] = value
        for key in SLURM_KEYS:
            value = self._resource(rule, key, None)
            if value is not None:
                out[key] = value
        return out

    def _check_resources(self) -> None:
        for scope, entry in self.config["resources"].items():
            if "cpus_per_task" in entry and "cpus_per_gpu" in entry:
                raise ValueError(
                    f"config resources.{scope} sets both cpus_per_task ({entry['cpus_per_task']})"
                    f" and cpus_per_gpu ({entry['cpus_per_gpu']}); Slurm takes one of them"
                )

    def check_rules(self, rules: Iterable[str]) -> None:
        """Every key of config ``resources`` must be ``default``, ``gpu_default`` or one of
        ``rules`` (the workflow's rules); a typo would place nothing."""
        known = sorted(set(rules))
        scopes = ("default", GPU_SCOPE)
        unknown = [r for r in self.config["resources"] if r not in scopes and r not in known]
        if unknown:
            raise StudyConfigError(
                f"config resources.{r}: {r!r} is not a rule{did_you_mean(r, known)}; "
                f"allowed: default, {GPU_SCOPE}, {listing(known)}"
                for r in unknown
            )
